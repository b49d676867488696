"""The whole stack as three real processes on loopback (drafter_svc, verifier_svc,
gateway), started once per session on free ports, readiness by health checks; the tiny
model pair in the real checkpoint formats; the target's own greedy decode as reference."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import openai
import pytest
import torch

from ddtree.engine import GenerationRequest, SpecParams, generate
from ddtree.healthcheck import is_serving
from ddtree.models.target import TargetModel
from ddtree.models.tiny import make_tiny_pair
from ddtree.runtime import load_pair

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 120.0
MODEL = "tiny-target"
BUDGET = 6  # the verifier's default tree budget
MAX_BUDGET = 32


@dataclass
class Stack:
    base_url: str  # http://127.0.0.1:PORT (the gateway)
    verifier_addr: str
    verifier_log: Path
    pair: Path

    def verifier_events(self, event: str, request_id: str) -> list[dict[str, Any]]:
        """The verifier's JSON log records of `event` for `request_id`, in order."""
        import json

        records = []
        for line in self.verifier_log.read_text().splitlines():
            if line.startswith("{") and f'"{request_id}"' in line:
                record = json.loads(line)
                if record.get("event") == event and record.get("request_id") == request_id:
                    records.append(record)
        return records


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn(module: str, args: list[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                            stdout=log, stderr=subprocess.STDOUT)


def wait_ready(name: str, process: subprocess.Popen[bytes], ready: Callable[[], bool],
               log: Path) -> None:
    """Polls `ready` (a health check) until it holds; fails at once if the process dies."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not ready():
        assert process.poll() is None, f"{name} exited:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{name} not ready:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)  # health endpoints answer at once while starting: pace the poll


def gateway_healthy(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/health", timeout=5.0).status_code == 200
    except httpx.HTTPError:
        return False


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny-pair")
    make_tiny_pair(root, family="llama")
    return root


def _commands(pair: Path, ports: dict[str, int]) -> dict[str, tuple[str, list[str]]]:
    cpu = ["--device", "cpu", "--dtype", "float32"]
    target = ["--target", str(pair / "target")]
    return {
        "drafter": ("drafter_svc", ["--drafter", str(pair / "drafter"), *target, *cpu,
                                    "--host", "127.0.0.1", "--port", str(ports["drafter"])]),
        "verifier": ("verifier_svc", [
            *target, *cpu, "--drafter-addr", f"127.0.0.1:{ports['drafter']}", "--host",
            "127.0.0.1", "--port", str(ports["verifier"]), "--mode", "tree", "--budget",
            str(BUDGET), "--max-budget", str(MAX_BUDGET), "--draft-timeout-s", "30",
            "--model-id", MODEL]),
        "gateway": ("gateway", [
            *target, "--verifier-addr", f"127.0.0.1:{ports['verifier']}", "--host",
            "127.0.0.1", "--port", str(ports["gateway"]), "--model-name", MODEL]),
    }


@pytest.fixture(scope="session")
def stack(pair: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("logs")
    ports = {name: free_port() for name in ("drafter", "verifier", "gateway")}
    base_url = f"http://127.0.0.1:{ports['gateway']}"
    checks: dict[str, Callable[[], bool]] = {
        "drafter": lambda: is_serving(f"127.0.0.1:{ports['drafter']}"),
        "verifier": lambda: is_serving(f"127.0.0.1:{ports['verifier']}"),
        "gateway": lambda: gateway_healthy(base_url),
    }
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        # The verifier connects to the drafter as it starts; the gateway waits for neither.
        for group in (("drafter",), ("verifier", "gateway")):
            for name in group:
                module, args = _commands(pair, ports)[name]
                with open(logs / f"{name}.log", "wb") as log:
                    processes[name] = spawn(module, args, log)
            for name in group:
                wait_ready(name, processes[name], checks[name], logs / f"{name}.log")
        yield Stack(base_url, f"127.0.0.1:{ports['verifier']}", logs / "verifier.log", pair)
    finally:
        for name in ("gateway", "verifier", "drafter"):
            if name in processes:
                stop(processes[name])


@pytest.fixture(scope="session")
def client(stack: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0,
                       timeout=120.0) as openai_client:
        yield openai_client


@pytest.fixture(scope="session")
def target(pair: Path) -> TargetModel:
    model, _ = load_pair(pair / "target", None, torch.device("cpu"), torch.float32)
    return model


@pytest.fixture(scope="session")
def tokenizer(pair: Path):  # noqa: ANN201 (a transformers tokenizer)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(pair / "target")


@pytest.fixture(scope="session")
def greedy(target: TargetModel) -> Callable[[list[int], int], list[int]]:
    """prompt ids, max_tokens -> the target's own greedy continuation (ar, no EOS stop)."""

    def run(prompt: list[int], max_tokens: int) -> list[int]:
        request = GenerationRequest(prompt, max_tokens, spec=SpecParams("ar"), ignore_eos=True)
        return [t for result, _ in generate(target, None, request) for t in result.new_tokens]

    return run


@pytest.fixture(scope="session")
def chat_prompt_ids(tokenizer: Any) -> Callable[[list[dict[str, str]]], list[int]]:
    """Messages -> the token ids the gateway must send (template rendered, then tokenized
    without extra special tokens, as `ddtree generate --chat` does)."""

    def encode(messages: list[dict[str, str]]) -> list[int]:
        text = tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    return encode
