"""`auto` behind a remote drafter: the engine measures ar's round at each batch bucket (the
verifier's work alone, replayed on scratch rows) while tree rounds are timed in traffic,
the drafter's hop included. So when the hop makes trees slower than ar, `auto` rows go to
ar instead of judging ar by a prior of 0.7 chain rounds (which made trees look better
than ar whatever the hop cost). Over the real drafter service on loopback gRPC."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtree.engine import Engine, EngineConfig, GenerationRequest, SpecParams
from ddtree.engine.policy import AR_MIN_SAMPLES
from ddtree.models.target import TargetModel
from drafter_svc.config import DrafterServiceConfig
from drafter_svc.server import build_server as build_drafter
from tests.integration.conftest import MAX_BUDGET, greedy_tokens, make_prompt
from verifier_svc.drafter_client import DrafterClient
from verifier_svc.remote_drafter import RemoteDrafter


@pytest.fixture()
def engine(drafter_client: DrafterClient, fp32_target: TargetModel) -> Engine:
    assert drafter_client.info is not None
    return Engine(fp32_target, RemoteDrafter(drafter_client, drafter_client.info, 20.0),
                  EngineConfig(max_num_seqs=4, max_queue=4, max_budget=MAX_BUDGET,
                               measure_policy=True))


def run(engine: Engine, prompts: list[list[int]],
        max_tokens: int) -> tuple[dict[str, list[int]], dict[str, str]]:
    """Every prompt as an `auto` generation at once -> tokens and final mode per request."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"auto{i}", GenerationRequest(
            prompt, max_tokens, spec=SpecParams("auto"), ignore_eos=True))
    tokens: dict[str, list[int]] = {f"auto{i}": [] for i in range(len(prompts))}
    modes: dict[str, str] = {}
    while engine.has_work:
        for request_id, result in engine.step():
            tokens[request_id] += result.new_tokens
            if result.finished and result.stats is not None:
                modes[request_id] = result.stats.mode
    return tokens, modes


def test_remote_auto_rows_measure_ar_alone_and_time_trees_in_traffic(
        engine: Engine, fp32_target: TargetModel) -> None:
    prompts = [make_prompt(fp32_target, 6 + i, 90 + i) for i in range(2)]
    tokens, _ = run(engine, prompts, 12)
    for i, prompt in enumerate(prompts):
        assert tokens[f"auto{i}"] == greedy_tokens(fp32_target, prompt, 12)
    policy = engine.policy
    assert policy is not None
    batches = policy.snapshot()["batches"]
    assert isinstance(batches, dict) and "2" in batches
    for batch, row in batches.items():  # 2, and 1 once a row finished first
        choices = row["choices"]
        assert choices["0"]["measured_ms"] is not None, batch  # ar: replayed on scratch rows
        assert all(choices[str(c)]["measured_ms"] is None for c in policy.choices), batch
    assert any(batches["2"]["choices"][str(c)]["traffic_rounds"] for c in policy.choices)
    assert engine.policy_measurements == len(batches)  # once per batch bucket


def test_remote_auto_rows_go_to_ar_when_the_hop_makes_trees_slower_than_ar(
        engine: Engine, fp32_target: TargetModel) -> None:
    policy = engine.policy
    assert policy is not None
    for choice in policy.choices:  # traffic: every tree round took 10 s (a slow hop)
        for _ in range(AR_MIN_SAMPLES):
            policy.observe(1, choice, 10.0, choice, [[0, 1, 2]])
    prompt = make_prompt(fp32_target, 7, 97)
    tokens, modes = run(engine, [prompt], 10)
    assert tokens["auto0"] == greedy_tokens(fp32_target, prompt, 10)
    assert policy.prefers_ar(1)  # ar measured in ms against 3 tokens per 10 s
    assert modes == {"auto0": "ar"}  # admitted as ar: it never drafted


def test_an_auto_row_whose_drafter_goes_away_continues_in_ar_with_the_greedy_tokens(
        tiny_pair: Path, fp32_target: TargetModel) -> None:
    """The drafter service stops after the row's first rounds: the row continues in ar
    and is no longer the policy's (it drafts nothing, so its rounds may be pipelined: a
    tree shape from the policy would have put the host's stale bonus token at its root,
    serving wrong tokens on the H200 in lease 9 call 26)."""
    server, port = build_drafter(DrafterServiceConfig(
        drafter=str(tiny_pair / "drafter"), target=str(tiny_pair / "target"),
        host="127.0.0.1", port=0, device="cpu", dtype="float32", max_budget=MAX_BUDGET))
    client = DrafterClient(f"127.0.0.1:{port}", 2.0, 2.0, fp32_target.config)
    client.connect(wait=True)
    assert client.info is not None
    engine = Engine(fp32_target, RemoteDrafter(client, client.info, 2.0),
                    EngineConfig(max_num_seqs=2, max_queue=2, max_budget=MAX_BUDGET))
    try:
        prompt = make_prompt(fp32_target, 9, 99)
        engine.add_request("auto0", GenerationRequest(prompt, 40, spec=SpecParams("auto"),
                                                      ignore_eos=True))
        tokens: list[int] = []
        for step in range(200):
            if step == 3:
                server.stop(None).wait()
            for _, result in engine.step():
                tokens += result.new_tokens
            if not engine.has_work:
                break
        assert tokens == greedy_tokens(fp32_target, prompt, 40)
    finally:
        client.close()
        server.stop(None)


def test_the_warm_up_verifies_scratch_trees_and_leaves_remote_rounds_exact(
        drafter_client: DrafterClient, fp32_target: TargetModel) -> None:
    """The verifier's start-up warm-up behind a remote drafter: every prefill bucket (with
    and without features) and, at every batch bucket, the verify half of ar and of each
    tree size on a scratch tree (no drafter call); then tree and auto generations still
    serve the greedy tokens and the policy has measured nothing."""
    assert drafter_client.info is not None
    engine = Engine(fp32_target, RemoteDrafter(drafter_client, drafter_client.info, 20.0),
                    EngineConfig(max_num_seqs=4, max_queue=4, max_budget=MAX_BUDGET,
                                 measure_policy=True, static_prefill=True,
                                 max_prefill_tokens=64))
    policy, prefill = engine.policy, engine._static_prefill
    assert policy is not None and prefill is not None
    node_buckets = {engine.plan.node_bucket(c) for c in (0, *policy.choices)}
    assert engine.warm_up() == (2 * len(prefill.buckets)
                                + len(engine.plan.batch_buckets) * len(node_buckets))
    assert engine.policy_measurements == 0 and engine.counters.num_rounds == 0
    prompts = [make_prompt(fp32_target, 7 + i, 70 + i) for i in range(3)]
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", GenerationRequest(
            prompt, 16, spec=SpecParams("tree", budget=8) if i else SpecParams("auto"),
            ignore_eos=True))
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    while engine.has_work:
        for request_id, result in engine.step():
            tokens[request_id] += result.new_tokens
    for i, prompt in enumerate(prompts):
        assert tokens[f"r{i}"] == greedy_tokens(fp32_target, prompt, 16)
