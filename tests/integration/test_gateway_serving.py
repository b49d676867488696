"""The gateway as a service others rely on, over real HTTP and a real verifier: /health
says 503 once the engine cannot admit work, /metrics speaks vLLM's names with the engine's
gauges, API keys guard /v1 only, request ids are the gateway's own, and a non-streaming
client that leaves is handled without an error."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from ddtree.v1 import verifier_pb2
from tests.integration.conftest import (
    MAX_SESSIONS,
    REPO,
    RPC_TIMEOUT_S,
    Verifier,
    gateway_config,
    running_gateway,
)
from tests.integration.test_gateway_limits import address

API_KEY = "sk-test-key"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
        "temperature": 0}


def wait_idle(verifier: Verifier) -> verifier_pb2.EngineStats:
    """GetStats until nothing runs (aborts land within a round)."""
    deadline = time.monotonic() + RPC_TIMEOUT_S
    while True:
        stats = verifier.stub.GetStats(verifier_pb2.StatsRequest(), timeout=RPC_TIMEOUT_S)
        if stats.num_running == 0 and stats.num_waiting == 0:
            return stats
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)  # polling the engine's counters


def test_health_is_503_while_every_kv_slot_is_taken(gateway: str, verifier: Verifier) -> None:
    wait_idle(verifier)
    assert httpx.get(f"{gateway}/health", timeout=10).status_code == 200
    sessions = []
    try:
        for seed in range(MAX_SESSIONS):
            opened = verifier.stub.OpenSession(verifier_pb2.OpenSessionRequest(
                prompt_ids=[5 + seed, 6, 7]), timeout=RPC_TIMEOUT_S)
            sessions.append(opened.session_id)
        reply = httpx.get(f"{gateway}/health", timeout=10)
        assert reply.status_code == 503 and reply.json()["status"] == "busy"
    finally:
        for session_id in sessions:
            verifier.stub.CloseSession(verifier_pb2.CloseSessionRequest(session_id=session_id),
                                       timeout=RPC_TIMEOUT_S)
    assert httpx.get(f"{gateway}/health", timeout=10).status_code == 200


def test_metrics_carry_vllm_names_and_the_engines_gauges(gateway: str) -> None:
    before = httpx.get(f"{gateway}/metrics", timeout=10).text
    with openai.OpenAI(base_url=f"{gateway}/v1", api_key="x", max_retries=0) as client:
        client.completions.create(model="tiny", prompt="Hello", max_tokens=6, temperature=0,
                                  extra_body={"ddtree": {"mode": "tree"}})
        events = list(client.completions.create(model="tiny", prompt="Hi", max_tokens=6,
                                                temperature=0, stream=True))
    text = httpx.get(f"{gateway}/metrics", timeout=10).text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_bucket", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:request_success_total",
                 "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total",
                 "ddtree:batch_size_bucket", "ddtree:num_requests_running",
                 "ddtree:verifier_up{model_name=\"tiny\"} 1.0"):
        assert name in text, name
    assert 'vllm:request_success_total{finished_reason="length",model_name="tiny"}' in text
    assert 'vllm:num_requests_running{model_name="tiny"}' in text
    # the way from the verifier's messages: every message taken up (both requests), and
    # every streamed event written to the client (the stream's)
    def count(metrics: str, name: str) -> float:
        prefix = f'ddtree:{name}_count{{model_name="tiny"}} '
        return sum(float(line[len(prefix):]) for line in metrics.splitlines()
                   if line.startswith(prefix))
    assert count(text, "verifier_read_seconds") >= count(before, "verifier_read_seconds") + 2
    assert count(text, "verifier_hop_seconds") >= count(before, "verifier_hop_seconds") + 2
    assert count(text, "delivery_seconds") >= count(before, "delivery_seconds") + len(events)
    # the first token's way, stage by stage: once per request each (the verifier says when
    # it read the request on every message)
    for stage in ("request_prepare_seconds", "verifier_start_seconds",
                  "verifier_first_token_seconds"):
        assert count(text, stage) == count(before, stage) + 2, stage


def test_metrics_answer_quickly_without_a_verifier(tiny_pair: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with running_gateway(gateway_config(tiny_pair, port, stats_timeout_s=0.5)) as url:
        started = time.monotonic()
        text = httpx.get(f"{url}/metrics", timeout=10).text
        assert time.monotonic() - started < 3.0
    assert 'ddtree:verifier_up{model_name="tiny"} 0.0' in text
    assert "vllm:num_requests_running" not in text  # unknown, not a made-up zero


@pytest.fixture(scope="module")
def keyed(tiny_pair: Path, verifier: Verifier) -> Iterator[str]:
    with running_gateway(gateway_config(tiny_pair, verifier.port, api_key=API_KEY)) as url:
        yield url


def test_the_api_key_guards_v1_and_leaves_health_and_metrics_open(keyed: str) -> None:
    for headers in ({}, {"authorization": "Bearer wrong"}):
        reply = httpx.post(f"{keyed}/v1/chat/completions", json=CHAT, headers=headers)
        assert reply.status_code == 401 and reply.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{keyed}/v1/models", headers=headers).status_code == 401
    assert httpx.get(f"{keyed}/health").status_code == 200
    assert httpx.get(f"{keyed}/metrics").status_code == 200
    with openai.OpenAI(base_url=f"{keyed}/v1", api_key=API_KEY, max_retries=0) as client:
        assert client.chat.completions.create(**CHAT).usage.completion_tokens == 3
    with openai.OpenAI(base_url=f"{keyed}/v1", api_key="wrong", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            client.models.list()


def test_a_clients_request_id_is_echoed_but_never_names_a_generation(
    gateway: str, verifier: Verifier
) -> None:
    body = {**CHAT, "max_tokens": 200, "ignore_eos": True, "stream": True,
            "ddtree": {"mode": "ar"}}
    headers = {"x-request-id": "victim"}
    with httpx.stream("POST", f"{gateway}/v1/chat/completions", json=body, headers=headers,
                      timeout=60) as first:
        assert first.headers["x-request-id"] == "victim"
        stream = first.iter_lines()
        chunk = json.loads(next(stream).removeprefix("data: "))
        assert "victim" not in chunk["id"] and len(chunk["id"]) >= 32
        # Whoever knows the client's id cannot abort the generation with it ...
        found = verifier.stub.Abort(verifier_pb2.AbortRequest(request_id="victim"),
                                    timeout=RPC_TIMEOUT_S)
        assert not found.found
        # ... and a second request with the same id runs beside it.
        second = httpx.post(f"{gateway}/v1/chat/completions", json=CHAT, headers=headers,
                            timeout=60)
        assert second.status_code == 200 and second.headers["x-request-id"] == "victim"
        lines = [line for line in stream if line]
    assert lines[-1] == "data: [DONE]" and '"finish_reason":"length"' in lines[-2]


def test_a_non_streaming_client_that_leaves_is_aborted_without_an_error(
    gateway: str, verifier: Verifier, capfd: pytest.CaptureFixture[str]
) -> None:
    body = json.dumps({"model": "tiny", "prompt": "count: 1 2 3", "max_tokens": 900,
                       "ignore_eos": True, "temperature": 0, "ddtree": {"mode": "ar"}}).encode()
    with socket.create_connection(address(gateway), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: " + str(len(body)).encode() +
                     b"\r\n\r\n" + body)
        time.sleep(0.5)  # the generation is running
    time.sleep(0.5)
    wait_idle(verifier)
    threading.Event().wait(0.2)  # let the gateway finish logging
    out = capfd.readouterr()
    logs = out.out + out.err
    assert "client_disconnected" in logs
    assert "InvalidStateError" not in logs and "Traceback" not in logs


def test_the_grafana_dashboard_queries_only_metrics_the_gateway_exports(gateway: str) -> None:
    dashboard = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    names = {n for q in queries for n in re.findall(r"\b((?:vllm|ddtree):[a-z_]+)", q)}
    assert len(names) >= 15
    with openai.OpenAI(base_url=f"{gateway}/v1", api_key="x", max_retries=0) as client:
        client.completions.create(model="tiny", prompt="Hello", max_tokens=6, temperature=0)
    text = httpx.get(f"{gateway}/metrics", timeout=10).text
    missing = sorted(n for n in names if n not in text)
    assert not missing, missing
