"""What surrounds the generations: /health, /metrics, a client that disconnects mid-stream
(its generation is aborted on the verifier), and token equality with `ddtree generate`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import grpc
import httpx
import openai

from ddtree.engine import MODES
from ddtree.v1 import verifier_pb2, verifier_pb2_grpc

LONG = 600  # tokens: far more than the stream lives before the client leaves


def test_health_is_200_when_the_verifier_serves(stack: Any) -> None:
    reply = httpx.get(f"{stack.base_url}/health")
    assert reply.status_code == 200 and reply.json()["status"] == "ok"


def test_metrics_expose_speculation_counters_and_latencies(
    client: openai.OpenAI, stack: Any
) -> None:
    client.completions.create(model="tiny-target", prompt="Hello", max_tokens=8,
                              temperature=0, extra_body={"ddtree": {"mode": "linear"}})
    text = httpx.get(f"{stack.base_url}/metrics").text
    for name in ("ddtree:spec_decode_num_drafts_total", "ddtree:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_drafts_total", "vllm:num_requests_running",
                 "ddtree:spec_decode_num_accepted_tokens_total", "ddtree:spec_accept_length",
                 "ddtree:time_to_first_token_seconds_bucket",
                 "ddtree:inter_token_latency_seconds_bucket",
                 "ddtree:e2e_request_latency_seconds_bucket",
                 'ddtree:spec_round_stage_seconds_bucket{le="0.0001",model_name="tiny-target",'
                 'stage="verify"}'):
        assert name in text, name


def wait_for(condition: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)  # polling a log file


def test_client_disconnect_aborts_the_generation_on_the_verifier(stack: Any) -> None:
    body = {"model": "tiny-target", "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": LONG, "temperature": 0, "stream": True, "ignore_eos": True,
            "ddtree": {"mode": "ar", "stream_granularity": "token"}}
    with httpx.stream("POST", f"{stack.base_url}/v1/chat/completions", json=body,
                      timeout=60.0) as reply:
        first = next(reply.iter_lines())
        assert first.startswith("data: ")
    request_id = json.loads(first.removeprefix("data: "))["id"].removeprefix("chatcmpl-")
    # The gateway's stream goes away (the verifier cancels the generation) and it sends
    # Abort; whichever comes first stops the generation while it runs.
    def stopped() -> list[dict[str, Any]]:
        return [event for name in ("generation_cancelled", "abort")
                for event in stack.verifier_events(name, request_id)]

    wait_for(lambda: bool(stopped()))
    assert any(event["found"] for event in stopped())
    # ... its KV slot is free again, and it never ran to its end.
    with grpc.insecure_channel(stack.verifier_addr) as channel:
        stub = verifier_pb2_grpc.VerifierStub(channel)
        wait_for(lambda: stub.GetStats(verifier_pb2.StatsRequest(), timeout=10).num_running == 0)
    finished = stack.verifier_events("generate_finished", request_id)
    assert not any(r["finish_reason"] for r in finished)


def test_greedy_chat_equals_ddtree_generate_in_ar_mode(
    client: openai.OpenAI, stack: Any
) -> None:
    assert "ar" in MODES
    message = "What is the capital of France?"
    cli = subprocess.run(
        [sys.executable, "-m", "ddtree.cli", "generate", "--mode", "ar", "--target",
         str(stack.pair / "target"), "--device", "cpu", "--dtype", "float32", "--chat",
         message, "--max-tokens", "24", "--json"],
        capture_output=True, text=True, timeout=300, check=True)
    expected = json.loads(cli.stdout.strip().splitlines()[-1])
    reply = client.chat.completions.create(
        model="tiny-target", messages=[{"role": "user", "content": message}], max_tokens=24,
        temperature=0, extra_body={"return_token_ids": True})  # tree mode, EOS honoured
    assert reply.choices[0].model_extra["token_ids"] == expected["token_ids"]
    assert reply.choices[0].message.content == expected["text"]
    assert reply.choices[0].finish_reason == expected["finish_reason"]
