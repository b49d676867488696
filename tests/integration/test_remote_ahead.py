"""With a remote drafter the engine asks for draft rounds before their step: the next
trees of every row right after a round's harvest (`EngineConfig.send_ahead`, the default),
or the rows form two halves that take turns (`alternate`: one half verifies while the
drafter drafts the other's next trees). Over the real drafter service (loopback gRPC, the
tiny pair): every generation still serves exactly what it serves when each round asks
for its trees in its own step (the target's greedy tokens at T = 0, the same seeded
samples at T > 0; auto rows too, whose tree size is chosen when the trees are asked
for), rounds really were asked for ahead, and rows that end, are aborted or join
meanwhile leave nothing behind."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ddtree.engine import Engine, EngineConfig, GenerationRequest, RoundResult, SpecParams
from ddtree.models.target import TargetModel
from ddtree.sampling import SamplingParams
from tests.integration.conftest import MAX_BUDGET, greedy_tokens, make_prompt
from verifier_svc.drafter_client import DrafterClient
from verifier_svc.remote_drafter import RemoteDrafter

SPECS = [SpecParams("tree", 8), SpecParams("linear"), SpecParams("tree", 5),
         SpecParams("ar"), SpecParams("shadow", 8), SpecParams("auto", 16)]
AHEAD = ("alternate", "send_ahead")  # the two ways of asking before the step


def engine_for(target: TargetModel, client: DrafterClient, variant: str) -> Engine:
    """variant: "alternate", "send_ahead" or "in_step" (each round asks in its own step)."""
    assert client.info is not None
    return Engine(target, RemoteDrafter(client, client.info, 20.0),
                  EngineConfig(max_num_seqs=6, max_queue=8, max_budget=MAX_BUDGET,
                               alternate=variant == "alternate",
                               send_ahead=variant == "send_ahead"))


def requests(target: TargetModel, sampled: bool) -> list[GenerationRequest]:
    out = []
    for i, spec in enumerate(SPECS):
        sampling = SamplingParams(0.8, top_k=0 if i % 2 else 12, seed=40 + i) if sampled \
            else SamplingParams()
        out.append(GenerationRequest(make_prompt(target, 4 + 3 * i, 70 + i), 14 + 3 * i,
                                     sampling, spec, ignore_eos=True))
    return out


def run_all(engine: Engine, reqs: list[GenerationRequest],
            abort_after: dict[str, int] | None = None,
            on_result: Callable[[RoundResult], None] | None = None) -> dict[str, list[int]]:
    """Each request's tokens; `on_result` sees every round's result."""
    for i, request in enumerate(reqs):
        engine.add_request(f"r{i}", request)
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(reqs))}
    steps = 0
    while engine.has_work:
        for request_id, result in engine.step():
            tokens[request_id] += result.new_tokens
            if on_result is not None:
                on_result(result)
        steps += 1
        for request_id, at in (abort_after or {}).items():
            if steps == at:
                assert engine.abort(request_id)
    return tokens


@pytest.mark.parametrize("variant", AHEAD)
@pytest.mark.parametrize("sampled", [False, True])
def test_rounds_asked_for_ahead_serve_what_rounds_asked_in_step_serve(
        fp32_target: TargetModel, drafter_client: DrafterClient, sampled: bool,
        variant: str) -> None:
    reqs = requests(fp32_target, sampled)
    turns = engine_for(fp32_target, drafter_client, variant)
    together = run_all(turns, reqs)
    lockstep = engine_for(fp32_target, drafter_client, "in_step")
    assert run_all(lockstep, reqs) == together
    assert lockstep.counters.num_sent_ahead == 0
    assert turns.counters.num_sent_ahead >= 5  # rounds were asked for ahead
    assert turns.counters.batch_sizes is not None
    if variant == "alternate":  # the halves took turns: rounds carried half the rows
        assert turns.counters.batch_sizes[3] >= 5
    else:  # one round carried every row
        assert turns.counters.batch_sizes[6] >= 5
    if not sampled:
        for i, request in enumerate(reqs):
            assert together[f"r{i}"] == greedy_tokens(fp32_target, request.prompt_ids,
                                                      request.max_tokens), SPECS[i]
    # Nothing left behind: no row, no round in flight, no round asked for ahead.
    assert turns.slots.num_used == 0 and not turns.running and not turns.has_work
    assert not turns._sent and not turns._flights


@pytest.mark.parametrize("variant", AHEAD)
def test_rows_that_join_or_are_aborted_meanwhile_leave_the_others_exact(
        fp32_target: TargetModel, drafter_client: DrafterClient, variant: str) -> None:
    reqs = requests(fp32_target, sampled=False) + [
        GenerationRequest(make_prompt(fp32_target, 7, 90), 20, spec=SpecParams("tree", 8),
                          ignore_eos=True)]  # a seventh: it waits for a row, then joins
    engine = engine_for(fp32_target, drafter_client, variant)
    tokens = run_all(engine, reqs, abort_after={"r1": 3, "r4": 4})
    assert engine.counters.num_sent_ahead > 0
    for i, request in enumerate(reqs):
        if f"r{i}" in ("r1", "r4"):
            continue
        assert tokens[f"r{i}"] == greedy_tokens(fp32_target, request.prompt_ids,
                                                request.max_tokens), i
    assert engine.slots.num_used == 0 and not engine.has_work and not engine._sent


def test_a_round_asked_for_ahead_of_rows_all_aborted_is_dropped(
        fp32_target: TargetModel, drafter_client: DrafterClient) -> None:
    """Every row aborted after its next trees were asked for: no round will take them, so
    they are dropped at once (nothing left in flight), and the next request is exact."""
    engine = engine_for(fp32_target, drafter_client, "send_ahead")
    first, second = (GenerationRequest(make_prompt(fp32_target, 5 + i, 60 + i), 24,
                                       spec=SpecParams("tree", 8), ignore_eos=True)
                     for i in range(2))
    engine.add_request("a", first)
    for _ in range(3):
        engine.step()
    assert engine._sent and engine.counters.num_sent_ahead >= 1
    assert engine.abort("a")
    assert not engine._sent and not engine.has_work and engine.slots.num_used == 0
    engine.add_request("b", second)
    tokens: list[int] = []
    while engine.has_work:
        for request_id, result in engine.step():
            assert request_id == "b"
            tokens += result.new_tokens
    assert tokens == greedy_tokens(fp32_target, second.prompt_ids, second.max_tokens)
    assert not engine._sent
