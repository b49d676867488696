"""Generate's options over the wire: the target's logprobs, seeded sampling, stop tokens,
and a drafter too slow for the per-round deadline (ar fallback, still exact)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from ddtree.models.target import TargetModel
from ddtree.service import CHANNEL_OPTIONS
from ddtree.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from tests.integration.conftest import (
    RPC_TIMEOUT_S,
    Verifier,
    generate_over_grpc,
    greedy_tokens,
    make_prompt,
)
from verifier_svc.config import VerifierServiceConfig
from verifier_svc.server import build_server

MAX_TOKENS = 16


def stream(
    stub: verifier_pb2_grpc.VerifierStub, **fields: object
) -> list[verifier_pb2.GenerateResponse]:
    request = verifier_pb2.GenerateRequest(max_tokens=MAX_TOKENS, **fields)
    return list(stub.Generate(request, timeout=RPC_TIMEOUT_S))


def test_logprobs_are_the_targets_for_every_streamed_token(
    verifier: Verifier, target: TargetModel
) -> None:
    prompt = make_prompt(target, 5, 30)
    responses = stream(verifier.stub, prompt_ids=prompt, ignore_eos=True, logprobs=True,
                       top_logprobs=2)
    tokens = [t for r in responses for t in r.token_ids]
    assert tokens == greedy_tokens(target, prompt, MAX_TOKENS)
    for response in responses:
        assert [lp.token_id for lp in response.logprobs] == list(response.token_ids)
        for logprob in response.logprobs:
            assert len(logprob.top) == 2 and logprob.logprob <= 0.0
            # At temperature 0 the committed token is the target's argmax.
            assert logprob.top[0].token_id == logprob.token_id
            assert logprob.top[0].logprob == pytest.approx(logprob.logprob)


def test_no_logprobs_unless_asked(verifier: Verifier, target: TargetModel) -> None:
    responses = stream(verifier.stub, prompt_ids=make_prompt(target, 3, 31))
    assert all(not r.logprobs for r in responses)


def test_seeded_sampling_is_reproducible(verifier: Verifier, target: TargetModel) -> None:
    sampling = common_pb2.SamplingParams(temperature=1.0, top_p=0.9, seed=7)
    prompt = make_prompt(target, 4, 32)
    runs = [
        [
            t
            for r in stream(verifier.stub, prompt_ids=prompt, sampling=sampling, ignore_eos=True)
            for t in r.token_ids
        ]
        for _ in range(2)
    ]
    assert runs[0] == runs[1] and len(runs[0]) == MAX_TOKENS


def test_stop_token_ends_the_generation_without_it(verifier: Verifier, target: TargetModel) -> None:
    prompt = make_prompt(target, 6, 33)
    greedy = greedy_tokens(target, prompt, MAX_TOKENS)
    stop = greedy[5]
    responses = stream(verifier.stub, prompt_ids=prompt, stop_token_ids=[stop], ignore_eos=True)
    tokens = [t for r in responses for t in r.token_ids]
    assert tokens == greedy[: greedy.index(stop)]
    assert responses[-1].finish_reason == "stop"
    assert responses[-1].stats.num_completion_tokens == len(tokens)


@pytest.fixture()
def impatient_verifier(
    tiny_pair: Path, drafter_port: int
) -> Iterator[verifier_pb2_grpc.VerifierStub]:
    """A verifier whose per-round draft deadline no drafter can meet."""
    config = VerifierServiceConfig(
        target=str(tiny_pair / "target"),
        drafter_addr=f"127.0.0.1:{drafter_port}",
        host="127.0.0.1",
        port=0,
        device="cpu",
        dtype="float32",
        draft_timeout_s=1e-4,
        draft_new_shape_timeout_s=1e-4,
    )
    server, port = build_server(config)
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS) as channel:
        yield verifier_pb2_grpc.VerifierStub(channel)
    server.stop(None)


def test_a_drafter_past_its_deadline_leaves_exact_ar_tokens(
    impatient_verifier: verifier_pb2_grpc.VerifierStub, target: TargetModel
) -> None:
    prompt = make_prompt(target, 5, 34)
    out = generate_over_grpc(impatient_verifier, prompt, MAX_TOKENS)
    assert out.tokens == greedy_tokens(target, prompt, MAX_TOKENS)
    assert out.stats.num_drafted_nodes == 0  # no tree arrived in time
