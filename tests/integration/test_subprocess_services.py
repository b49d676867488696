"""The services as real processes (`python -m drafter_svc`, `python -m verifier_svc`):
a drafter SIGKILLed mid-generation leaves the generation to finish in ar mode with the
target's exact greedy tokens, and a restarted drafter is picked up again by later ones."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from ddtree.healthcheck import wait_until_serving
from ddtree.models.target import TargetModel
from ddtree.service import CHANNEL_OPTIONS
from ddtree.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from tests.integration.conftest import (
    RPC_TIMEOUT_S,
    free_port,
    generate_over_grpc,
    greedy_tokens,
    make_prompt,
    spawn,
    stop,
)

STARTUP_TIMEOUT_S = 120.0
MAX_TOKENS = 40


def start_drafter(pair: Path, port: int) -> subprocess.Popen[bytes]:
    drafter, target = str(pair / "drafter"), str(pair / "target")
    flags = f"--host 127.0.0.1 --port {port} --device cpu --dtype float32".split()
    process = spawn("drafter_svc", "--drafter", drafter, "--target", target, *flags)
    assert wait_until_serving(f"127.0.0.1:{port}", STARTUP_TIMEOUT_S), "drafter did not start"
    return process


@dataclass
class Services:
    drafter: subprocess.Popen[bytes]
    drafter_port: int
    verifier: subprocess.Popen[bytes]
    stub: verifier_pb2_grpc.VerifierStub


@pytest.fixture()
def services(tiny_pair: Path) -> Iterator[Services]:
    drafter_port, verifier_port = free_port(), free_port()
    drafter = start_drafter(tiny_pair, drafter_port)
    flags = (
        f"--drafter-addr 127.0.0.1:{drafter_port} --host 127.0.0.1 --port {verifier_port} "
        "--device cpu --dtype float32 --mode tree --budget 6 --draft-timeout-s 20"
    ).split()
    verifier = spawn("verifier_svc", "--target", str(tiny_pair / "target"), *flags)
    with grpc.insecure_channel(f"127.0.0.1:{verifier_port}", options=CHANNEL_OPTIONS) as channel:
        running = Services(drafter, drafter_port, verifier, verifier_pb2_grpc.VerifierStub(channel))
        try:
            assert wait_until_serving(f"127.0.0.1:{verifier_port}", STARTUP_TIMEOUT_S)
            yield running
        finally:
            stop(running.verifier)
            stop(running.drafter)  # the test may have replaced it


def drafter_connected(stub: verifier_pb2_grpc.VerifierStub) -> bool:
    info = stub.GetModelInfo(verifier_pb2.ModelInfoRequest(), timeout=RPC_TIMEOUT_S)
    return bool(info.drafter_connected)


def test_killing_the_drafter_mid_generation_still_serves_greedy_tokens(
    services: Services, target: TargetModel, tiny_pair: Path
) -> None:
    stub = services.stub
    assert drafter_connected(stub)
    prompt = make_prompt(target, 6, 20)
    request = verifier_pb2.GenerateRequest(
        request_id="survivor",
        prompt_ids=prompt,
        max_tokens=MAX_TOKENS,
        ignore_eos=True,
        spec=common_pb2.SpecParams(mode=common_pb2.MODE_TREE),
    )
    tokens, last = [], None
    for i, response in enumerate(stub.Generate(request, timeout=RPC_TIMEOUT_S)):
        tokens += response.token_ids
        last = response
        if i == 0:
            services.drafter.send_signal(signal.SIGKILL)
            services.drafter.wait()
    assert last is not None and last.finish_reason == "length"
    assert tokens == greedy_tokens(target, prompt, MAX_TOKENS)

    # Without a drafter, speculative requests are served in ar mode (still exact).
    assert not drafter_connected(stub)
    out = generate_over_grpc(stub, prompt, 8)
    assert out.tokens == tokens[:8] and out.stats.num_drafted_nodes == 0

    # A drafter back on the same address is reconnected in the background.
    services.drafter = start_drafter(tiny_pair, services.drafter_port)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not drafter_connected(stub):
        assert time.monotonic() < deadline, "the verifier did not reconnect to the drafter"
        time.sleep(0.2)
    out = generate_over_grpc(stub, prompt, MAX_TOKENS)
    assert out.tokens == tokens and out.stats.num_drafted_nodes > 0


def test_a_hung_drafter_costs_a_round_one_deadline_not_every_round(
    services: Services, target: TargetModel
) -> None:
    """SIGSTOP the drafter: the round that waits for it gives up at its deadline (derived
    from the measured round trip, not the 20 s cap) and its rows go on in ar; later rounds
    and ar requests no longer wait for it at all."""
    stub = services.stub
    prompt = make_prompt(target, 6, 21)
    reference = greedy_tokens(target, prompt, MAX_TOKENS)
    assert generate_over_grpc(stub, prompt, MAX_TOKENS).tokens == reference  # warm
    services.drafter.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        out = generate_over_grpc(stub, prompt, MAX_TOKENS,
                                 spec=common_pb2.SpecParams(mode=common_pb2.MODE_TREE))
        assert out.tokens == reference
        assert time.monotonic() - started < 10.0  # one short deadline, then ar
        started = time.monotonic()
        ar = generate_over_grpc(stub, prompt, 8,
                                spec=common_pb2.SpecParams(mode=common_pb2.MODE_AR))
        assert ar.tokens == reference[:8] and time.monotonic() - started < 5.0
    finally:
        services.drafter.send_signal(signal.SIGCONT)
