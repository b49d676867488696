"""With a remote drafter the engine's rows form two halves that take turns (Engine.step):
one half verifies while the drafter drafts the other's next trees. Over the real drafter
service (loopback gRPC, the tiny pair): every generation still serves exactly what it
serves in lockstep rounds (the target's greedy tokens at T = 0, the same seeded samples
at T > 0), the halves really alternate, and rows that end, are aborted or join mid-turn
leave nothing behind."""

from __future__ import annotations

import pytest

from ddtree.engine import Engine, EngineConfig, GenerationRequest, SpecParams
from ddtree.models.target import TargetModel
from ddtree.sampling import SamplingParams
from tests.integration.conftest import MAX_BUDGET, greedy_tokens, make_prompt
from verifier_svc.drafter_client import DrafterClient
from verifier_svc.remote_drafter import RemoteDrafter

SPECS = [SpecParams("tree", 8), SpecParams("linear"), SpecParams("tree", 5),
         SpecParams("ar"), SpecParams("shadow", 8), SpecParams("tree", 16)]


def engine_for(target: TargetModel, client: DrafterClient, alternate: bool) -> Engine:
    assert client.info is not None
    return Engine(target, RemoteDrafter(client, client.info, 20.0),
                  EngineConfig(max_num_seqs=6, max_queue=8, max_budget=MAX_BUDGET,
                               alternate=alternate))


def requests(target: TargetModel, sampled: bool) -> list[GenerationRequest]:
    out = []
    for i, spec in enumerate(SPECS):
        sampling = SamplingParams(0.8, top_k=0 if i % 2 else 12, seed=40 + i) if sampled \
            else SamplingParams()
        out.append(GenerationRequest(make_prompt(target, 4 + 3 * i, 70 + i), 14 + 3 * i,
                                     sampling, spec, ignore_eos=True))
    return out


def run_all(engine: Engine, reqs: list[GenerationRequest],
            abort_after: dict[str, int] | None = None) -> dict[str, list[int]]:
    for i, request in enumerate(reqs):
        engine.add_request(f"r{i}", request)
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(reqs))}
    steps = 0
    while engine.has_work:
        for request_id, result in engine.step():
            tokens[request_id] += result.new_tokens
        steps += 1
        for request_id, at in (abort_after or {}).items():
            if steps == at:
                assert engine.abort(request_id)
    return tokens


@pytest.mark.parametrize("sampled", [False, True])
def test_alternating_halves_serve_what_lockstep_rounds_serve(
        fp32_target: TargetModel, drafter_client: DrafterClient, sampled: bool) -> None:
    reqs = requests(fp32_target, sampled)
    turns = engine_for(fp32_target, drafter_client, alternate=True)
    together = run_all(turns, reqs)
    lockstep = engine_for(fp32_target, drafter_client, alternate=False)
    assert run_all(lockstep, reqs) == together
    assert lockstep.counters.num_sent_ahead == 0
    # The halves took turns: rounds were asked for ahead, and rounds carried half the rows.
    assert turns.counters.num_sent_ahead >= 5
    assert turns.counters.batch_sizes is not None and turns.counters.batch_sizes[3] >= 5
    if not sampled:
        for i, request in enumerate(reqs):
            assert together[f"r{i}"] == greedy_tokens(fp32_target, request.prompt_ids,
                                                      request.max_tokens), SPECS[i]
    # Nothing left behind: no row, no round in flight, no round asked for ahead.
    assert turns.slots.num_used == 0 and not turns.running and not turns.has_work
    assert not turns._sent and not turns._flights


def test_rows_that_join_or_are_aborted_mid_turn_leave_the_others_exact(
        fp32_target: TargetModel, drafter_client: DrafterClient) -> None:
    reqs = requests(fp32_target, sampled=False) + [
        GenerationRequest(make_prompt(fp32_target, 7, 90), 20, spec=SpecParams("tree", 8),
                          ignore_eos=True)]  # a seventh: it waits for a row, then joins
    engine = engine_for(fp32_target, drafter_client, alternate=True)
    tokens = run_all(engine, reqs, abort_after={"r1": 3, "r4": 4})
    assert engine.counters.num_sent_ahead > 0
    for i, request in enumerate(reqs):
        if f"r{i}" in ("r1", "r4"):
            continue
        assert tokens[f"r{i}"] == greedy_tokens(fp32_target, request.prompt_ids,
                                                request.max_tokens), i
    assert engine.slots.num_used == 0 and not engine.has_work and not engine._sent
