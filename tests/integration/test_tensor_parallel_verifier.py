"""`python -m verifier_svc --tensor-parallel-size 2` as a real process (gloo on the CPU,
float32) behind a real drafter: tree-mode generations over gRPC serve the target's own
greedy tokens, and a follower SIGKILLed takes the verifier down with a log line saying so
(ddtree serve's supervisor then restarts it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc

from ddtree.healthcheck import wait_until_serving
from ddtree.models.target import TargetModel
from ddtree.service import CHANNEL_OPTIONS
from ddtree.v1 import common_pb2, verifier_pb2_grpc
from tests.integration.conftest import (
    REPO,
    free_port,
    generate_over_grpc,
    greedy_tokens,
    make_prompt,
    stop,
)
from tests.integration.test_subprocess_services import STARTUP_TIMEOUT_S, start_drafter
from verifier_svc.server import FOLLOWER_DIED_EXIT_CODE

MAX_TOKENS = 24


def followers_of(pid: int) -> list[int]:
    """The spawned children of `pid` (not multiprocessing's resource tracker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"spawn_main" in cmdline:
                found.append(int(entry.name))
    return found


def test_a_tp2_verifier_serves_greedy_tokens_and_dies_with_its_follower(
    tiny_pair: Path, target: TargetModel, tmp_path: Path
) -> None:
    drafter_port, verifier_port = free_port(), free_port()
    drafter = start_drafter(tiny_pair, drafter_port)
    flags = (f"--drafter-addr 127.0.0.1:{drafter_port} --host 127.0.0.1 --port {verifier_port} "
             "--device cpu --dtype float32 --mode tree --budget 6 --draft-timeout-s 20 "
             "--tensor-parallel-size 2").split()
    log_path = tmp_path / "verifier.log"
    verifier = subprocess.Popen(
        [sys.executable, "-m", "verifier_svc", "--target", str(tiny_pair / "target"), *flags],
        cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT)
    try:
        assert wait_until_serving(f"127.0.0.1:{verifier_port}", STARTUP_TIMEOUT_S)
        with grpc.insecure_channel(f"127.0.0.1:{verifier_port}",
                                   options=CHANNEL_OPTIONS) as channel:
            stub = verifier_pb2_grpc.VerifierStub(channel)
            prompt = make_prompt(target, 7, 30)
            out = generate_over_grpc(stub, prompt, MAX_TOKENS,
                                     spec=common_pb2.SpecParams(mode=common_pb2.MODE_TREE))
            assert out.tokens == greedy_tokens(target, prompt, MAX_TOKENS)
            assert out.stats.num_drafted_nodes > 0
        (follower,) = followers_of(verifier.pid)
        os.kill(follower, signal.SIGKILL)
        assert verifier.wait(timeout=30) == FOLLOWER_DIED_EXIT_CODE
        log = log_path.read_text()
        assert "tensor_parallel_follower_died" in log, log[-2000:]
    finally:
        stop(verifier)
        stop(drafter)
