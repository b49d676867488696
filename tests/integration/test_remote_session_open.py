"""With a remote drafter, a row admitted into running rows opens its drafter session after
its first round's verify is launched, not inside that round's exchange (over the real
drafter service, loopback gRPC, the tiny pair): the running rows' exchange carries no
prompt features, the new row's first round verifies its root alone (alone or beside
others), it drafts from its second round on, and every generation still serves the
target's greedy tokens. Asked for ahead (send_ahead, the default) or in the round's own
step alike."""

from __future__ import annotations

import pytest

from ddtree.engine import Engine, EngineConfig, GenerationRequest, SpecParams
from ddtree.models.target import TargetModel
from ddtree.v1 import drafter_pb2
from tests.integration.conftest import MAX_BUDGET, greedy_tokens, make_prompt
from verifier_svc.drafter_client import DrafterClient
from verifier_svc.remote_drafter import RemoteDrafter


@pytest.mark.parametrize("send_ahead", [True, False])
def test_a_new_row_opens_its_session_beside_the_round_and_drafts_from_the_next(
        fp32_target: TargetModel, drafter_client: DrafterClient, send_ahead: bool) -> None:
    assert drafter_client.info is not None
    engine = Engine(fp32_target, RemoteDrafter(drafter_client, drafter_client.info, 20.0),
                    EngineConfig(max_num_seqs=4, max_budget=MAX_BUDGET, send_ahead=send_ahead))
    exchanged: list[list[int]] = []  # per round asked for (in step or ahead): features
    posted: list[list[int]] = []  # per posted open: the same
    post, send = drafter_client.post, drafter_client.send  # (an exchange sends too)

    def watched_send(request: drafter_pb2.DraftRequest) -> object:
        exchanged.append(list(request.batch.num_features))
        return send(request)

    def watched_post(request: drafter_pb2.DraftRequest) -> None:
        posted.append(list(request.batch.num_features))
        post(request)

    drafter_client.send = watched_send  # type: ignore[method-assign,assignment]
    drafter_client.post = watched_post  # type: ignore[method-assign]
    first = GenerationRequest(make_prompt(fp32_target, 9, 3), 30, spec=SpecParams("tree", 8),
                              ignore_eos=True)
    second = GenerationRequest(make_prompt(fp32_target, 13, 4), 20,
                               spec=SpecParams("tree", 8), ignore_eos=True)
    engine.add_request("a", first)
    tokens: dict[str, list[int]] = {"a": [], "b": []}
    drafted: dict[str, list[int]] = {"a": [], "b": []}
    steps = 0
    while engine.has_work:
        steps += 1
        if steps == 3:
            exchanged.clear()
            posted.clear()
            engine.add_request("b", second)
        for request_id, result in engine.step():
            tokens[request_id] += result.new_tokens
            if result.acceptance_length:  # a round's result (the prefill's has none)
                drafted[request_id].append(result.num_drafted_nodes)
        if steps == 3 and not send_ahead:
            # "b" was admitted: the round's exchange carried "a" alone, with its few
            # new rows; "b"'s 13 prompt rows went in a posted open after the launch.
            assert exchanged == [[exchanged[0][0]]] and exchanged[0][0] <= 8
            assert posted == [[13]]
        elif steps == 3:
            # The round took "a"'s trees asked for at step 2's end; "b"'s 13 prompt rows
            # went in a posted open after the launch, and the next round's trees were asked
            # for at this step's end: "a" and "b", each with its few new rows.
            assert posted == [[13]]
            assert len(exchanged) == 1 and len(exchanged[0]) == 2 and max(exchanged[0]) <= 8
    for request_id, request in (("a", first), ("b", second)):
        assert tokens[request_id] == greedy_tokens(fp32_target, request.prompt_ids,
                                                   request.max_tokens)
    for request_id in ("a", "b"):  # the first round: the root alone; then trees of 8
        assert drafted[request_id][0] == 0 and set(drafted[request_id][1:]) == {8}
    assert engine.slots.num_used == 0 and not engine.running
