"""Errors over one real keep-alive HTTP connection: out-of-range integers and lone
surrogates are 400s naming the parameter, every error is an OpenAI error object with a
clean message (no 'None', no internal path or address, 405 not an internal error), and the
connection survives every one of them."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest

from tests.integration.conftest import free_port, gateway_config, running_gateway

BIG = 2**31
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
        "temperature": 0}
COMPLETION = {"model": "tiny", "prompt": "Hi", "max_tokens": 2, "temperature": 0}


class KeepAlive:
    """One HTTP/1.1 connection; `local_port` changes if the server ever closed it."""

    def __init__(self, url: str) -> None:
        parsed = urlparse(url)
        self.conn = http.client.HTTPConnection(str(parsed.hostname), parsed.port, timeout=60)
        self.conn.connect()
        assert self.conn.sock is not None
        self.local_port = self.conn.sock.getsockname()[1]

    def send(self, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
        headers = {"content-type": "application/json"} if body is not None else {}
        self.conn.request(method, path, body=body, headers=headers)
        reply = self.conn.getresponse()
        data = reply.read()
        assert reply.getheader("connection", "").lower() != "close"
        assert self.conn.sock is not None, "the server closed the connection"
        assert self.conn.sock.getsockname()[1] == self.local_port, "a new connection was opened"
        return reply.status, json.loads(data) if data else None


@pytest.fixture()
def connection(gateway: str) -> Iterator[KeepAlive]:
    keep_alive = KeepAlive(gateway)
    yield keep_alive
    keep_alive.conn.close()


@pytest.mark.parametrize(
    ("path", "fields", "param"),
    [
        ("/v1/chat/completions", {"max_tokens": BIG}, "max_tokens"),
        ("/v1/chat/completions", {"max_completion_tokens": BIG}, "max_completion_tokens"),
        ("/v1/chat/completions", {"top_k": BIG}, "top_k"),
        ("/v1/chat/completions", {"stop_token_ids": [3, BIG]}, "stop_token_ids[1]"),
        ("/v1/chat/completions", {"ddtree": {"budget": BIG}}, "ddtree.budget"),
        ("/v1/chat/completions", {"ddtree": {"max_topk": BIG}}, "ddtree.max_topk"),
        ("/v1/chat/completions", {"seed": 2**64}, "seed"),
        ("/v1/completions", {"prompt": [5, BIG]}, "prompt"),
    ],
)
def test_integers_past_int32_are_400_naming_the_parameter_and_keep_the_connection(
    connection: KeepAlive, path: str, fields: dict[str, Any], param: str
) -> None:
    base = CHAT if "chat" in path else COMPLETION
    for _ in range(2):  # the same connection answers twice, then serves a good request
        status, body = connection.send("POST", path, json.dumps({**base, **fields}).encode())
        assert status == 400, body
        assert body["error"]["param"].startswith(param) and body["error"]["type"] == \
            "invalid_request_error"
    status, body = connection.send("POST", path, json.dumps(base).encode())
    assert status == 200 and body["usage"]["completion_tokens"] == 2


def test_a_lone_surrogate_is_400_and_the_connection_lives_on(connection: KeepAlive) -> None:
    for body in (b'{"model": "tiny", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
                 b'{"model": "tiny", "prompt": "\\udfff", "max_tokens": 1}'):
        path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
        status, reply = connection.send("POST", path, body)
        assert status == 400, reply
        assert reply["error"]["param"] in ("messages[0].content", "prompt")
        assert "Unicode" in reply["error"]["message"]
    status, reply = connection.send("POST", "/v1/completions", json.dumps(COMPLETION).encode())
    assert status == 200


def test_error_messages_are_clean(connection: KeepAlive) -> None:
    status, body = connection.send("POST", "/v1/chat/completions", b"")
    assert status == 400 and "None" not in body["error"]["message"]
    status, body = connection.send("POST", "/v1/chat/completions", b"[1, 2]")
    assert status == 400 and "None" not in body["error"]["message"]
    status, body = connection.send("POST", "/v1/chat/completions", b'{"model": "tiny"}')
    assert status == 400 and body["error"]["param"] == "messages"
    status, body = connection.send("GET", "/v1/chat/completions")
    assert status == 405 and body["error"]["type"] == "invalid_request_error"
    status, body = connection.send("GET", "/v1/nothing-here")
    assert status == 404 and body["error"]["type"] == "invalid_request_error"
    status, body = connection.send("GET", "/v1/models")
    assert status == 200 and "/" not in json.dumps(body["data"][0]).replace("\\/", "")


def test_a_down_verifier_is_503_with_no_internal_address(tiny_pair: Path) -> None:
    port = free_port()  # nothing listens there
    config = gateway_config(tiny_pair, port, retry_attempts=2, retry_timeout_s=1.0)
    with running_gateway(config) as url:
        health = httpx.get(f"{url}/health", timeout=30)
        reply = httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=60)
    assert health.status_code == 503 and reply.status_code == 503
    for text in (health.text, reply.text):
        assert str(port) not in text and "127.0.0.1" not in text
    assert reply.json()["error"]["type"] == "service_unavailable_error"
