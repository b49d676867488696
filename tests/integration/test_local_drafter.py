"""The verifier with its drafter in the same process (`--local-drafter`, what `ddtree serve
--colocate-drafter` runs): over real gRPC every drafting mode serves the target's greedy
tokens in float32, alone and side by side, the rounds really draft, and GetModelInfo
reports the drafter; the start-up warm-up counts nothing and leaves the engine exact."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
import torch

from ddtree.engine import GenerationRequest, SpecParams, generate
from ddtree.models.target import TargetModel, load_target
from ddtree.service import CHANNEL_OPTIONS
from ddtree.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from tests.integration.conftest import (
    MAX_BUDGET,
    MAX_SESSIONS,
    Verifier,
    generate_over_grpc,
    greedy_tokens,
    make_prompt,
)
from tests.integration.test_grpc_services import open_session, verify
from verifier_svc.config import VerifierServiceConfig
from verifier_svc.server import build_engine
from verifier_svc.server import build_server as build_verifier

MAX_TOKENS = 24


def local_config(tiny_pair: Path, **fields: object) -> VerifierServiceConfig:
    config = VerifierServiceConfig(
        target=str(tiny_pair / "target"), local_drafter=str(tiny_pair / "drafter"),
        host="127.0.0.1", port=0, device="cpu", dtype="float32", mode="tree", budget=8,
        max_budget=MAX_BUDGET, max_num_seqs=MAX_SESSIONS, max_queue=0)
    return replace(config, **fields)


@pytest.fixture(scope="module")
def local_verifier(tiny_pair: Path) -> Iterator[Verifier]:
    server, port = build_verifier(local_config(tiny_pair))
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS)
    yield Verifier(port, channel, verifier_pb2_grpc.VerifierStub(channel))
    channel.close()
    server.stop(None)


SPECS = {
    "tree@8": common_pb2.SpecParams(mode=common_pb2.MODE_TREE, budget=8),
    "linear": common_pb2.SpecParams(mode=common_pb2.MODE_LINEAR),
    "shadow@16": common_pb2.SpecParams(mode=common_pb2.MODE_SHADOW, budget=16),
    "auto": common_pb2.SpecParams(mode=common_pb2.MODE_AUTO),
}


@pytest.mark.parametrize("name", list(SPECS))
def test_each_mode_serves_the_greedy_tokens_and_drafts(
        local_verifier: Verifier, fp32_target: TargetModel, name: str) -> None:
    prompt = make_prompt(fp32_target, 12, seed=3)
    got = generate_over_grpc(local_verifier.stub, prompt, MAX_TOKENS, SPECS[name])
    assert got.tokens == greedy_tokens(fp32_target, prompt, MAX_TOKENS)
    if name != "auto":  # auto may judge ar cheaper on the CPU
        assert sum(nodes for _, nodes in got.rounds) > 0, "no round drafted a tree"


def test_generations_side_by_side_equal_their_single_runs(
        local_verifier: Verifier, fp32_target: TargetModel) -> None:
    prompts = [make_prompt(fp32_target, 8 + 3 * i, seed=10 + i) for i in range(4)]
    specs = list(SPECS.values())
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(
            lambda job: generate_over_grpc(local_verifier.stub, job[0], MAX_TOKENS, job[1]),
            zip(prompts, specs, strict=True)))
    for prompt, result in zip(prompts, results, strict=True):
        assert result.tokens == greedy_tokens(fp32_target, prompt, MAX_TOKENS)


def test_client_trees_still_verify_beside_the_local_drafter(
        local_verifier: Verifier, fp32_target: TargetModel) -> None:
    """The Verify API (a client's own trees) on the same engine: a branching tree accepts
    the right branch while a generation drafts locally."""
    prompt = make_prompt(fp32_target, 5, seed=21)
    greedy = greedy_tokens(fp32_target, prompt, 8)
    with ThreadPoolExecutor(1) as pool:
        drafting = pool.submit(generate_over_grpc, local_verifier.stub,
                               make_prompt(fp32_target, 9, seed=22), MAX_TOKENS, SPECS["tree@8"])
        opened = open_session(local_verifier, prompt)
        assert opened.bonus_token == greedy[0]
        wrong = [(t + 1) % fp32_target.config.vocab_size for t in greedy]
        tokens = [greedy[0], wrong[1], greedy[1], wrong[2], greedy[2], greedy[3]]
        reply = verify(local_verifier, opened.session_id, tokens, [-1, 0, 0, 2, 2, 4])
        assert list(reply.accepted_path) == [0, 2, 4, 5]
        assert list(reply.committed_tokens) == greedy[:4] and reply.bonus_token == greedy[4]
        assert drafting.result().finish_reason == "length"


def test_model_info_reports_the_drafter(local_verifier: Verifier, tiny_pair: Path) -> None:
    info = local_verifier.stub.GetModelInfo(verifier_pb2.ModelInfoRequest(), timeout=10)
    assert info.drafter_connected and info.block_size > 1


def test_the_warm_up_counts_nothing_and_leaves_the_engine_exact(
        tiny_pair: Path, fp32_target: TargetModel) -> None:
    target = load_target(tiny_pair / "target", "cpu", torch.float32).eval()  # its own
    engine = build_engine(local_config(tiny_pair), target, None)  # CPU: no graphs, no warm-up
    assert engine.policy is not None and engine.policy.choices
    node_buckets = {engine.plan.node_bucket(c) for c in (0, *engine.policy.choices)}
    assert engine.warm_up() == len(engine.plan.batch_buckets) * len(node_buckets)
    assert len(engine.plan.batch_buckets) > 1 and len(node_buckets) > 2
    assert not engine.has_work and engine.counters.num_rounds == 0
    assert engine.policy_measurements == 0  # the policy times real traffic later
    prompt = make_prompt(fp32_target, 10, seed=7)
    request = GenerationRequest(prompt_ids=prompt, max_tokens=MAX_TOKENS, ignore_eos=True,
                                spec=SpecParams(mode="tree", budget=16))
    tokens = [token for result, _ in generate(target, None, request, engine=engine)
              for token in result.new_tokens]
    assert tokens == greedy_tokens(fp32_target, prompt, MAX_TOKENS)


@pytest.mark.parametrize("fields, message", [
    ({"drafter_addr": "127.0.0.1:1"}, "exclude each other"),
    ({"tensor_parallel_size": 2}, "tensor-parallel-size 1 only"),
    ({"local_drafter": "", "mode": "tree"}, "needs --drafter-addr or --local-drafter"),
])
def test_the_config_refuses_what_cannot_run(tiny_pair: Path, fields: dict[str, object],
                                            message: str) -> None:
    with pytest.raises(ValueError, match=message):
        local_config(tiny_pair, **fields)
