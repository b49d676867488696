"""Shared fixtures for the services over real loopback gRPC: the tiny model pair (written
once per session in the real checkpoint formats), in-process drafter and verifier servers
on port 0, stubs, and the target's own greedy tokens as the reference."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import torch
import uvicorn

from ddtree.engine import GenerationRequest, SpecParams, generate
from ddtree.models.target import TargetModel
from ddtree.models.tiny import make_tiny_pair
from ddtree.runtime import load_pair
from ddtree.service import CHANNEL_OPTIONS
from ddtree.v1 import common_pb2, drafter_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from drafter_svc.config import DrafterServiceConfig
from drafter_svc.server import build_server as build_drafter
from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.limits import with_header_timeout
from gateway.verifier_client import VerifierClient
from verifier_svc.config import VerifierServiceConfig
from verifier_svc.drafter_client import DrafterClient
from verifier_svc.server import build_server as build_verifier

REPO = Path(__file__).resolve().parents[2]
MAX_BUDGET = 64
MAX_SESSIONS = 6
# Every call in these tests has a deadline: a hung service fails the test, not CI's clock.
RPC_TIMEOUT_S = 60.0


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny-pair")
    make_tiny_pair(root, family="llama")
    return root


@pytest.fixture(scope="session")
def target(tiny_pair: Path) -> TargetModel:
    model, _ = load_pair(tiny_pair / "target", None, torch.device("cpu"), torch.float32)
    return model


def greedy_tokens(target: TargetModel, prompt: list[int], max_tokens: int) -> list[int]:
    """The target's own greedy continuation (the engine's ar mode, no EOS stop)."""
    request = GenerationRequest(prompt, max_tokens, spec=SpecParams("ar"), ignore_eos=True)
    return [t for result, _ in generate(target, None, request) for t in result.new_tokens]


def make_prompt(target: TargetModel, length: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, target.config.vocab_size, (length,), generator=gen).tolist()


@pytest.fixture(scope="session")
def fp32_target(tiny_pair: Path) -> TargetModel:
    """The tiny target in float32 on the CPU, for engines built in the test's process."""
    model, _ = load_pair(tiny_pair / "target", None, torch.device("cpu"), torch.float32)
    return model


@pytest.fixture(scope="session")
def drafter_port(tiny_pair: Path) -> Iterator[int]:
    config = DrafterServiceConfig(
        drafter=str(tiny_pair / "drafter"),
        target=str(tiny_pair / "target"),
        host="127.0.0.1",
        port=0,
        device="cpu",
        dtype="float32",
        max_budget=MAX_BUDGET,
    )
    server, port = build_drafter(config)
    yield port
    server.stop(None)


@dataclass
class Verifier:
    port: int
    channel: grpc.Channel
    stub: verifier_pb2_grpc.VerifierStub


@pytest.fixture(scope="session")
def verifier(tiny_pair: Path, drafter_port: int) -> Iterator[Verifier]:
    config = VerifierServiceConfig(
        target=str(tiny_pair / "target"),
        drafter_addr=f"127.0.0.1:{drafter_port}",
        host="127.0.0.1",
        port=0,
        device="cpu",
        dtype="float32",
        mode="tree",
        budget=8,
        max_budget=MAX_BUDGET,
        max_num_seqs=MAX_SESSIONS,
        max_queue=0,
    )
    server, port = build_verifier(config)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS)
    yield Verifier(port, channel, verifier_pb2_grpc.VerifierStub(channel))
    channel.close()
    server.stop(None)


@pytest.fixture()
def drafter_client(drafter_port: int, fp32_target: TargetModel) -> Iterator[DrafterClient]:
    """A verifier's link to the session's drafter service, connected."""
    client = DrafterClient(f"127.0.0.1:{drafter_port}", 20.0, 20.0, fp32_target.config)
    client.connect(wait=True)
    assert client.info is not None, "the drafter service did not answer"
    yield client
    client.close()


@pytest.fixture(scope="session")
def drafter_stub(drafter_port: int) -> Iterator[drafter_pb2_grpc.DrafterStub]:
    with grpc.insecure_channel(f"127.0.0.1:{drafter_port}", options=CHANNEL_OPTIONS) as channel:
        yield drafter_pb2_grpc.DrafterStub(channel)


@dataclass
class Generated:
    tokens: list[int]
    chunks: list[list[int]]
    finish_reason: str
    stats: common_pb2.SpecStats
    rounds: list[tuple[int, int]]  # each message's (acceptance_length, num_drafted_nodes)


def generate_over_grpc(
    stub: verifier_pb2_grpc.VerifierStub,
    prompt: list[int],
    max_tokens: int,
    spec: common_pb2.SpecParams | None = None,
    request_id: str = "",
) -> Generated:
    request = verifier_pb2.GenerateRequest(
        request_id=request_id,
        prompt_ids=prompt,
        max_tokens=max_tokens,
        ignore_eos=True,
        spec=spec,
    )
    chunks, reason, stats, rounds = [], "", common_pb2.SpecStats(), []
    for response in stub.Generate(request, timeout=RPC_TIMEOUT_S):
        chunks.append(list(response.token_ids))
        rounds.extend(zip(response.acceptance_lengths, response.drafted_nodes, strict=True))
        if response.finish_reason:
            reason, stats = response.finish_reason, response.stats
    return Generated([t for c in chunks for t in c], chunks, reason, stats, rounds)


async def engine_idle(client: VerifierClient, tries: int = 200) -> bool:
    """Whether the verifier's pool empties (nothing running or waiting) within `tries`
    polls of GetStats, 50 ms apart."""
    for _ in range(tries):
        stats = await client.engine_stats()
        if stats.num_running == 0 and stats.num_waiting == 0:
            return True
        await asyncio.sleep(0.05)
    return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn(module: str, *args: str) -> subprocess.Popen[bytes]:
    """`python -m module args` with this interpreter; its log goes to the test's output."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=env)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def running_gateway(config: GatewayConfig) -> Iterator[str]:
    """The gateway app served by uvicorn over real HTTP on a free loopback port, in a
    thread of this process; -> its base URL."""
    app = create_app(config, VerifierClient.from_config(config))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(
        app, http=with_header_timeout(config.header_timeout_s), log_config=None,
        access_log=False, timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + RPC_TIMEOUT_S
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.02)  # uvicorn sets `started` from its own thread
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def gateway_config(tiny_pair: Path, verifier_port: int, **fields: object) -> GatewayConfig:
    return GatewayConfig(verifier_addr=f"127.0.0.1:{verifier_port}",
                         tokenizer=str(tiny_pair / "target"), model_name="tiny",
                         **fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def gateway(tiny_pair: Path, verifier: Verifier) -> Iterator[str]:
    """A gateway over the session's verifier (default settings); -> its base URL."""
    with running_gateway(gateway_config(tiny_pair, verifier.port)) as url:
        yield url
