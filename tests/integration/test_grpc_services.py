"""The drafter and verifier services in-process over loopback gRPC: every mode serves the
target's greedy tokens, clients verify their own trees, malformed input is rejected with
INVALID_ARGUMENT / NOT_FOUND while the server keeps serving, concurrency, Abort, capacity,
health and reflection."""

from __future__ import annotations

import re
import threading

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from ddtree import codec, draft_codec
from ddtree.engine import SpecParams
from ddtree.models.target import TargetModel
from ddtree.service import CHANNEL_OPTIONS
from ddtree.v1 import common_pb2, drafter_pb2, drafter_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from tests.integration.conftest import (
    MAX_BUDGET,
    MAX_SESSIONS,
    RPC_TIMEOUT_S,
    Verifier,
    generate_over_grpc,
    greedy_tokens,
    make_prompt,
)

MAX_TOKENS = 24
SPECS = {
    "ar": common_pb2.SpecParams(mode=common_pb2.MODE_AR),
    "linear": common_pb2.SpecParams(mode=common_pb2.MODE_LINEAR),
    "tree": common_pb2.SpecParams(),  # the server default: tree, budget 8
    "tree-b24-k3": common_pb2.SpecParams(mode=common_pb2.MODE_TREE, budget=24, max_topk=3),
    "shadow": common_pb2.SpecParams(mode=common_pb2.MODE_SHADOW, budget=6),
}


def wait_drafter_connected(verifier: Verifier) -> None:
    info = verifier.stub.GetModelInfo(verifier_pb2.ModelInfoRequest(), timeout=RPC_TIMEOUT_S)
    assert info.drafter_connected, "the verifier should connect to the drafter at start-up"


@pytest.mark.parametrize("mode", list(SPECS))
def test_generate_at_temperature_zero_serves_the_targets_greedy_tokens(
    verifier: Verifier, target: TargetModel, mode: str
) -> None:
    wait_drafter_connected(verifier)
    for seed, length in ((0, 7), (1, 1)):
        prompt = make_prompt(target, length, seed)
        out = generate_over_grpc(verifier.stub, prompt, MAX_TOKENS, SPECS[mode])
        assert out.tokens == greedy_tokens(target, prompt, MAX_TOKENS)
        assert out.finish_reason == "length"
        assert out.stats.num_completion_tokens == MAX_TOKENS
        assert out.stats.num_prompt_tokens == length
        assert out.stats.mode == ("tree" if mode.startswith("tree") else mode)
        # Drafting really happened (no silent ar fallback) in the speculative modes.
        assert (out.stats.num_drafted_nodes > 0) == (mode != "ar")
        # The messages carry each verify round's own figures (none for the prefill); they
        # add up to the final totals.
        assert len(out.rounds) == out.stats.num_rounds
        assert sum(nodes for _, nodes in out.rounds) == out.stats.num_drafted_nodes
        histogram = out.stats.acceptance_histogram
        assert sorted(n for n, _ in out.rounds) == [
            length for length, count in enumerate(histogram) for _ in range(count)]


def open_session(verifier: Verifier, prompt: list[int]) -> verifier_pb2.OpenSessionResponse:
    return verifier.stub.OpenSession(
        verifier_pb2.OpenSessionRequest(prompt_ids=prompt), timeout=RPC_TIMEOUT_S
    )


def verify(
    verifier: Verifier, session_id: str, tokens: list[int], parents: list[int], **kwargs: object
) -> verifier_pb2.VerifyResponse:
    tree = common_pb2.DraftTree(tokens=tokens, parents=parents)
    return verifier.stub.Verify(
        verifier_pb2.VerifyRequest(session_id=session_id, tree=tree, **kwargs),
        timeout=RPC_TIMEOUT_S,
    )


def test_client_chain_trees_commit_the_targets_greedy_tokens(
    verifier: Verifier, target: TargetModel
) -> None:
    prompt = make_prompt(target, 6, 4)
    greedy = greedy_tokens(target, prompt, 20)
    opened = open_session(verifier, prompt)
    assert opened.bonus_token == greedy[0] and opened.committed_len == len(prompt)
    # A right chain of 3: all accepted, bonus = the target's next token.
    reply = verify(
        verifier, opened.session_id, greedy[0:4], [-1, 0, 1, 2], committed_len=len(prompt)
    )
    assert list(reply.accepted_path) == [0, 1, 2, 3]
    assert list(reply.committed_tokens) == greedy[0:4] and reply.bonus_token == greedy[4]
    # A chain that is wrong from its first drafted token: only the root is committed.
    wrong = (greedy[5] + 1) % target.config.vocab_size
    reply = verify(
        verifier,
        opened.session_id,
        [greedy[4], wrong, greedy[6]],
        [-1, 0, 1],
        committed_len=len(prompt) + 4,
    )
    assert list(reply.accepted_path) == [0]
    assert list(reply.committed_tokens) == [greedy[4]] and reply.bonus_token == greedy[5]
    assert reply.committed_len == len(prompt) + 5
    closed = verifier.stub.CloseSession(
        verifier_pb2.CloseSessionRequest(session_id=opened.session_id), timeout=RPC_TIMEOUT_S
    )
    assert closed.found


def test_client_branching_tree_accepts_the_right_branch(
    verifier: Verifier, target: TargetModel
) -> None:
    prompt = make_prompt(target, 4, 5)
    greedy = greedy_tokens(target, prompt, 8)
    opened = open_session(verifier, prompt)
    vocab = target.config.vocab_size
    wrong = [(t + 1) % vocab for t in greedy]
    # root -> {1: wrong, 2: right}; 2 -> {3: wrong, 4: right}; 4 -> 5: right
    tokens = [greedy[0], wrong[1], greedy[1], wrong[2], greedy[2], greedy[3]]
    reply = verify(verifier, opened.session_id, tokens, [-1, 0, 0, 2, 2, 4], return_features=False)
    assert list(reply.accepted_path) == [0, 2, 4, 5]
    assert list(reply.committed_tokens) == greedy[:4] and reply.bonus_token == greedy[4]
    verifier.stub.CloseSession(
        verifier_pb2.CloseSessionRequest(session_id=opened.session_id), timeout=RPC_TIMEOUT_S
    )


def bad_scores(dtype: torch.dtype, n: int) -> common_pb2.DraftTree:
    tree = common_pb2.DraftTree(tokens=[0] * 2, parents=[-1, 0])
    tree.scores.CopyFrom(codec.tensor_to_proto(torch.zeros(n, dtype=dtype)))
    return tree


MALFORMED = {
    "parent-after-child": ([None, 5, 6], [-1, 2, 0], "parents\\[1\\] = 2 must be a node before 1"),
    "cycle": ([None, 5, 6], [-1, 2, 1], "parents\\[1\\] = 2"),
    "oversized": ([None] + [5] * (MAX_BUDGET + 1), [-1] + [0] * (MAX_BUDGET + 1), "nodes"),
    "token-out-of-vocab": ([None, 10**6], [-1, 0], "vocab|out of"),
    "wrong-root": ("wrong-root", [-1, 0], "bonus token"),
}


@pytest.mark.parametrize("case", list(MALFORMED) + ["scores-dtype", "scores-shape", "scores-bytes"])
def test_malformed_tree_is_invalid_argument_and_the_server_keeps_serving(
    verifier: Verifier, target: TargetModel, case: str
) -> None:
    prompt = make_prompt(target, 5, 6)
    greedy = greedy_tokens(target, prompt, 3)
    opened = open_session(verifier, prompt)
    if case in MALFORMED:
        tokens, parents, message = MALFORMED[case]
        if tokens == "wrong-root":
            tokens = [(opened.bonus_token + 1) % target.config.vocab_size, 5]
        tokens = [opened.bonus_token if t is None else t for t in tokens]
        tree = common_pb2.DraftTree(tokens=tokens, parents=parents)
    else:
        tree, message = {
            "scores-dtype": (bad_scores(torch.int32, 2), "dtype must be torch.float32"),
            "scores-shape": (bad_scores(torch.float32, 3), "expected \\[2\\]"),
            "scores-bytes": (bad_scores(torch.float32, 2), "bytes of data"),
        }[case]
        tree.tokens[0] = opened.bonus_token
        if case == "scores-bytes":
            tree.scores.data = tree.scores.data[:-1]
    with pytest.raises(grpc.RpcError) as caught:
        verifier.stub.Verify(
            verifier_pb2.VerifyRequest(session_id=opened.session_id, tree=tree),
            timeout=RPC_TIMEOUT_S,
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert re.search(message, caught.value.details()), caught.value.details()
    # The session and the server are untouched: a valid tree right after succeeds.
    reply = verify(verifier, opened.session_id, greedy[:2], [-1, 0])
    assert list(reply.committed_tokens) == greedy[:2]
    verifier.stub.CloseSession(
        verifier_pb2.CloseSessionRequest(session_id=opened.session_id), timeout=RPC_TIMEOUT_S
    )


def test_unknown_session_is_not_found_and_stale_guard_is_invalid(
    verifier: Verifier, target: TargetModel
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        verify(verifier, "no-such-session", [1], [-1])
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "no-such-session" in caught.value.details()
    opened = open_session(verifier, make_prompt(target, 3, 7))
    with pytest.raises(grpc.RpcError) as caught:
        verify(verifier, opened.session_id, [opened.bonus_token], [-1], committed_len=99)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "committed_len 99" in caught.value.details()
    verifier.stub.CloseSession(
        verifier_pb2.CloseSessionRequest(session_id=opened.session_id), timeout=RPC_TIMEOUT_S
    )
    with pytest.raises(grpc.RpcError) as caught:
        verify(verifier, opened.session_id, [opened.bonus_token], [-1])
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_bad_generate_request_is_invalid_argument(verifier: Verifier) -> None:
    for request in (
        verifier_pb2.GenerateRequest(prompt_ids=[], max_tokens=4),
        verifier_pb2.GenerateRequest(prompt_ids=[10**6], max_tokens=4),
        verifier_pb2.GenerateRequest(
            prompt_ids=[5], max_tokens=4, spec=common_pb2.SpecParams(budget=MAX_BUDGET + 1)
        ),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            list(verifier.stub.Generate(request, timeout=RPC_TIMEOUT_S))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_open_sessions_beyond_capacity_are_resource_exhausted(
    verifier: Verifier, target: TargetModel
) -> None:
    prompt = make_prompt(target, 3, 8)
    opened = [open_session(verifier, prompt) for _ in range(MAX_SESSIONS)]
    try:
        with pytest.raises(grpc.RpcError) as caught:
            open_session(verifier, prompt)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        for session in opened:
            verifier.stub.CloseSession(
                verifier_pb2.CloseSessionRequest(session_id=session.session_id),
                timeout=RPC_TIMEOUT_S,
            )
    again = open_session(verifier, prompt)  # room again
    verifier.stub.CloseSession(
        verifier_pb2.CloseSessionRequest(session_id=again.session_id), timeout=RPC_TIMEOUT_S
    )


def test_two_concurrent_generations_are_both_correct(
    verifier: Verifier, target: TargetModel
) -> None:
    prompts = [make_prompt(target, 5, 10), make_prompt(target, 9, 11)]
    results: dict[int, list[int]] = {}

    def run(i: int) -> None:
        results[i] = generate_over_grpc(verifier.stub, prompts[i], MAX_TOKENS).tokens

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=RPC_TIMEOUT_S)
    for i, prompt in enumerate(prompts):
        assert results[i] == greedy_tokens(target, prompt, MAX_TOKENS)


def test_abort_stops_a_generation_and_frees_it(verifier: Verifier, target: TargetModel) -> None:
    request = verifier_pb2.GenerateRequest(
        request_id="to-abort",
        prompt_ids=make_prompt(target, 4, 12),
        max_tokens=400,
        ignore_eos=True,
    )
    stream = verifier.stub.Generate(request, timeout=RPC_TIMEOUT_S)
    next(stream)  # the generation is running
    assert verifier.stub.Abort(verifier_pb2.AbortRequest(request_id="to-abort")).found
    with pytest.raises(grpc.RpcError) as caught:
        for _ in stream:
            pass
    assert caught.value.code() == grpc.StatusCode.CANCELLED
    assert not verifier.stub.Abort(verifier_pb2.AbortRequest(request_id="to-abort")).found
    # The id is free again.
    out = generate_over_grpc(verifier.stub, list(request.prompt_ids), 4, request_id="to-abort")
    assert len(out.tokens) == 4


def test_cancelled_generate_rpc_frees_the_generation(
    verifier: Verifier, target: TargetModel
) -> None:
    request = verifier_pb2.GenerateRequest(
        request_id="to-cancel",
        prompt_ids=make_prompt(target, 4, 13),
        max_tokens=400,
        ignore_eos=True,
    )
    stream = verifier.stub.Generate(request, timeout=RPC_TIMEOUT_S)
    next(stream)
    stream.cancel()
    # Readiness polling: Abort answers found=False once the engine dropped the generation.
    for _ in range(200):
        if not verifier.stub.Abort(
            verifier_pb2.AbortRequest(request_id="to-cancel"), timeout=RPC_TIMEOUT_S
        ).found:
            break
        threading.Event().wait(0.05)
    else:
        pytest.fail("the cancelled generation is still running")


def test_health_answers_serving(verifier: Verifier, drafter_port: int) -> None:
    for port, service in (
        (verifier.port, "ddtree.v1.Verifier"),
        (drafter_port, "ddtree.v1.Drafter"),
    ):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for name in ("", service):
                reply = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_services(verifier: Verifier, drafter_port: int) -> None:
    for port, service in (
        (verifier.port, "ddtree.v1.Verifier"),
        (drafter_port, "ddtree.v1.Drafter"),
    ):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            reply = next(stub.ServerReflectionInfo(iter([request]), timeout=10))
            names = {s.name for s in reply.list_services_response.service}
            assert {service, "grpc.health.v1.Health"} <= names


def test_model_info_describes_the_pair(verifier: Verifier, target: TargetModel) -> None:
    info = verifier.stub.GetModelInfo(verifier_pb2.ModelInfoRequest(), timeout=RPC_TIMEOUT_S)
    assert info.vocab_size == target.config.vocab_size and info.drafter_connected
    assert info.default_mode == "tree" and info.default_budget == 8
    assert info.max_budget == MAX_BUDGET and info.block_size > 1
    assert list(info.eos_token_ids) == list(target.config.eos_token_ids)


def test_drafter_item_errors_do_not_end_the_stream(
    drafter_stub: drafter_pb2_grpc.DrafterStub, target: TargetModel
) -> None:
    info = drafter_stub.GetInfo(drafter_pb2.DrafterInfoRequest(), timeout=RPC_TIMEOUT_S)
    width = len(info.target_layer_ids) * info.hidden_size
    spec = codec.spec_to_proto(SpecParams("tree", 4))

    def item(session_id: str, rows: int, cols: int) -> drafter_pb2.DraftItem:
        return drafter_pb2.DraftItem(
            session_id=session_id,
            committed_len=rows,
            bonus_token=5,
            spec=spec,
            features=codec.tensor_to_proto(torch.randn(rows, cols)),
        )

    requests = [
        drafter_pb2.DraftRequest(
            round_id=1, items=[item("bad", 3, width + 1), item("ok", 3, width)]
        ),
        drafter_pb2.DraftRequest(
            round_id=2, items=[item("new", 2, width)], release_sessions=["ok"]
        ),
    ]
    replies = list(drafter_stub.Draft(iter(requests), timeout=RPC_TIMEOUT_S))
    assert [r.round_id for r in replies] == [1, 2]
    bad, ok = replies[0].results
    assert bad.error_code == "INVALID_ARGUMENT" and "width" in bad.error
    assert not ok.error and ok.committed_len == 3 and len(ok.tree.tokens) == 5
    assert ok.tree.tokens[0] == 5 and list(ok.tree.parents)[0] == -1
    assert not replies[1].results[0].error


def test_a_batched_round_fails_only_its_bad_rows_and_a_malformed_batch_fails_all(
    drafter_stub: drafter_pb2_grpc.DrafterStub,
) -> None:
    info = drafter_stub.GetInfo(drafter_pb2.DrafterInfoRequest(), timeout=RPC_TIMEOUT_S)
    assert info.wire_version == draft_codec.DRAFT_WIRE_VERSION
    width = len(info.target_layer_ids) * info.hidden_size
    spec = SpecParams("tree", 4)

    def batch(session_ids: list[str], num_features: list[int], bonus: int = 5,
              specs: bool = True) -> drafter_pb2.DraftBatch:
        return draft_codec.draft_batch_to_proto(
            session_ids, num_features, [bonus] * len(session_ids),
            torch.randn(sum(num_features), width), num_features,
            dict.fromkeys(range(len(session_ids)), spec) if specs else {})

    first = batch(["batch-a", "batch-b"], [3, 2])
    first.bonus_token[1] = info.vocab_size  # out of the vocabulary: this row alone fails
    malformed = batch(["batch-c"], [2])
    malformed.num_features[0] = 1  # the features no longer add up: the batch fails
    unknown = batch(["batch-a", "batch-z"], [0, 1], specs=False)
    unknown.committed_len[0] = 3  # batch-a continues with no new rows
    requests = [drafter_pb2.DraftRequest(round_id=i + 1, batch=b)
                for i, b in enumerate((first, malformed, unknown))]
    replies = list(drafter_stub.Draft(iter(requests), timeout=RPC_TIMEOUT_S))
    assert [r.round_id for r in replies] == [1, 2, 3] and not replies[0].results
    trees = [draft_codec.draft_trees_from_proto(r.trees, len(b.session_ids), 1 + 4)
             for r, b in zip(replies, (first, malformed, unknown), strict=True)]
    assert trees[0].num_nodes.tolist() == [5, 0] and trees[0].committed_len.tolist() == [3, 2]
    assert trees[0].tokens[0, 0] == 5 and trees[0].parents[0, 0] == -1
    assert trees[0].errors[1][1] == "INVALID_ARGUMENT" and "bonus_token" in trees[0].errors[1][0]
    assert trees[1].num_nodes.tolist() == [0] and "batch.features" in trees[1].errors[0][0]
    assert trees[2].num_nodes.tolist() == [5, 0]
    assert trees[2].errors == {1: (trees[2].errors[1][0], "NOT_FOUND")}


def test_a_rounds_tree_shapes_override_the_sessions_and_bad_ones_fail_their_row(
    drafter_stub: drafter_pb2_grpc.DrafterStub,
) -> None:
    """Wire version 3 (the verifier's `auto` rows): each row's tree size and chain rule
    for this round come with the round; a size outside [1, max nodes] fails its row."""
    info = drafter_stub.GetInfo(drafter_pb2.DrafterInfoRequest(), timeout=RPC_TIMEOUT_S)
    width = len(info.target_layer_ids) * info.hidden_size
    depth = info.block_size - 1
    shape = draft_codec.draft_batch_to_proto(
        ["shape-a", "shape-b", "shape-c"], [3, 3, 3], [5, 5, 5], torch.randn(9, width),
        [3, 3, 3], dict.fromkeys(range(3), SpecParams("tree", 16)),
        num_nodes=[depth, 2, 0], force_chain=[True, False, False])
    replies = list(drafter_stub.Draft(iter([drafter_pb2.DraftRequest(round_id=1, batch=shape)]),
                                      timeout=RPC_TIMEOUT_S))
    trees = draft_codec.draft_trees_from_proto(replies[0].trees, 3, 1 + 16)
    assert trees.num_nodes.tolist() == [1 + depth, 3, 0]  # not the sessions' 16
    assert trees.parents[0, : 1 + depth].tolist() == [-1, *range(depth)]  # the chain
    assert trees.errors[2][1] == "INVALID_ARGUMENT" and "num_nodes 0" in trees.errors[2][0]


def test_sessions_return_the_targets_features_on_request(
    verifier: Verifier, target: TargetModel, drafter_stub: drafter_pb2_grpc.DrafterStub
) -> None:
    info = drafter_stub.GetInfo(drafter_pb2.DrafterInfoRequest(), timeout=RPC_TIMEOUT_S)
    width = len(info.target_layer_ids) * target.config.hidden_size  # k*H
    prompt = make_prompt(target, 5, 14)
    greedy = greedy_tokens(target, prompt, 4)
    opened = verifier.stub.OpenSession(
        verifier_pb2.OpenSessionRequest(prompt_ids=prompt, return_features=True),
        timeout=RPC_TIMEOUT_S,
    )
    assert list(opened.features.shape) == [len(prompt), width]  # (P, k*H)
    reply = verify(verifier, opened.session_id, greedy[:3], [-1, 0, 1], return_features=True)
    features = codec.tensor_from_proto(reply.features, ndim=2)
    assert tuple(features.shape) == (3, width) and features.is_floating_point()  # (A, k*H)
    verifier.stub.CloseSession(
        verifier_pb2.CloseSessionRequest(session_id=opened.session_id), timeout=RPC_TIMEOUT_S
    )


def test_only_the_caller_that_started_a_generation_can_abort_it(
    verifier: Verifier, target: TargetModel
) -> None:
    request = verifier_pb2.GenerateRequest(
        request_id="mine", prompt_ids=make_prompt(target, 4, 15), max_tokens=60,
        ignore_eos=True)
    stream = verifier.stub.Generate(request, timeout=RPC_TIMEOUT_S)
    first = next(stream)
    # Its own connection (channels in one process share connections by default).
    options = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
    with grpc.insecure_channel(f"127.0.0.1:{verifier.port}", options=options) as other:
        stranger = verifier_pb2_grpc.VerifierStub(other)
        reply = stranger.Abort(verifier_pb2.AbortRequest(request_id="mine"), timeout=RPC_TIMEOUT_S)
        assert not reply.found
    tokens = [t for response in stream for t in response.token_ids]
    assert len(first.token_ids) + len(tokens) == 60  # ran to its end
