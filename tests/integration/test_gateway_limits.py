"""What a client can cost the gateway, over real HTTP (uvicorn on loopback) in front of a
real verifier: body size (413 before parsing), slow heads and bodies (closed / 408),
tokenization off the event loop (/health stays quick during a huge prompt), the context
length checked before the verifier sees anything, and rejections counted apart."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from tests.integration.conftest import Verifier, gateway_config, running_gateway

LIMIT = 64 * 1024
TIMEOUT_S = 1.0  # the request head's
BODY_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def limited(tiny_pair: Path, verifier: Verifier) -> Iterator[str]:
    config = gateway_config(tiny_pair, verifier.port, max_request_bytes=LIMIT,
                            header_timeout_s=TIMEOUT_S, body_timeout_s=BODY_TIMEOUT_S)
    with running_gateway(config) as url:
        yield url


def address(url: str) -> tuple[str, int]:
    parsed = urlparse(url)
    return str(parsed.hostname), int(parsed.port or 80)


def test_a_body_over_the_limit_is_413_before_it_is_read(limited: str) -> None:
    big = {"model": "tiny", "prompt": "x" * (2 * LIMIT), "max_tokens": 1}
    reply = httpx.post(f"{limited}/v1/completions", json=big, timeout=30)
    assert reply.status_code == 413
    error = reply.json()["error"]
    assert error["code"] == "request_too_large" and str(LIMIT) in error["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(2 * LIMIT // 1024):
            yield b"y" * 1024
        yield b'"}'

    reply = httpx.post(f"{limited}/v1/completions", content=chunks(),
                       headers={"content-type": "application/json"}, timeout=30)
    assert reply.status_code == 413


def test_a_request_head_that_trickles_is_cut_off(limited: str) -> None:
    with socket.create_connection(address(limited), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never finished
        started = time.monotonic()
        assert sock.recv(1024) == b""  # the server closed the connection
        assert time.monotonic() - started < TIMEOUT_S + 5


def test_the_next_request_head_on_a_kept_alive_connection_is_timed_too(limited: str) -> None:
    with socket.create_connection(address(limited), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            reply += sock.recv(4096)  # the health answer (a small JSON body)
        assert reply.startswith(b"HTTP/1.1 200")
        time.sleep(TIMEOUT_S / 2)  # an answered request: the timer started again
        sock.sendall(b"GET /health HTTP/1.1\r\n")  # never finished
        started = time.monotonic()
        while sock.recv(1024):
            pass  # anything left of the first answer, then the close
        assert time.monotonic() - started < TIMEOUT_S + 5


def test_the_head_timer_stops_at_the_end_of_the_head(limited: str) -> None:
    """A body that comes after the head's timeout (within the body's) is answered: the
    head timer stopped when the head was in."""
    body = b'{"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2}'
    with socket.create_connection(address(limited), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                     % len(body))
        time.sleep(TIMEOUT_S * 1.3)
        sock.sendall(body)
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200") and b'"choices"' in reply, reply[:300]


def test_a_body_that_never_arrives_is_408(limited: str) -> None:
    with socket.create_connection(address(limited), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: 100\r\n\r\n{\"model\"")
        reply = b""
        while chunk := sock.recv(4096):  # the head and the body may come in two segments
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 408") and b"request_timeout" in reply


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values = [float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text,
                                           re.MULTILINE)]
    return sum(values)


def test_a_prompt_past_the_model_length_is_400_and_counted_as_rejected(gateway: str) -> None:
    before_prompt = metric(gateway, "ddtree:prompt_tokens_total")
    before_rejected = metric(gateway, "ddtree:request_rejected_total")
    before_finished = metric(gateway, "vllm:request_success_total")
    long_prompt = list(range(5, 5 + 1500))  # tiny target: max_model_len 1024
    reply = httpx.post(f"{gateway}/v1/completions", timeout=30,
                       json={"model": "tiny", "prompt": long_prompt, "max_tokens": 4})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert "1024" in error["message"]
    reply = httpx.post(f"{gateway}/v1/completions", timeout=30,
                       json={"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 1022})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "max_tokens"
    assert metric(gateway, "ddtree:request_rejected_total") == before_rejected + 2
    assert metric(gateway, "ddtree:prompt_tokens_total") == before_prompt
    assert metric(gateway, "vllm:request_success_total") == before_finished


def test_health_answers_at_once_while_a_huge_prompt_is_tokenized(gateway: str) -> None:
    text = "hello world, this is a test. " * 60_000  # 1.7 MB: seconds of tokenizing
    result: dict[str, int] = {}

    def post() -> None:
        reply = httpx.post(f"{gateway}/v1/completions", timeout=120,
                           json={"model": "tiny", "prompt": text, "max_tokens": 1})
        result["status"] = reply.status_code

    worker = threading.Thread(target=post)
    worker.start()
    latencies = []
    with httpx.Client(timeout=30) as client:
        while worker.is_alive():
            started = time.monotonic()
            assert client.get(f"{gateway}/health").status_code == 200
            latencies.append(time.monotonic() - started)
            time.sleep(0.05)  # a probe's pace
    worker.join()
    assert result["status"] == 400  # far past the tiny model's length
    assert len(latencies) >= 3 and max(latencies) < 1.0, latencies
