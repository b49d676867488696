"""Request validation through the real app (Starlette's TestClient): every unknown or
unsupported parameter is a 400 OpenAI error object naming it; an unknown model is a 404;
x-request-id is echoed. The verifier address is a closed loopback port, so the checks
that run before any RPC are isolated, and the ones after it see a verifier that is down."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ddtree.models.tiny import build_tokenizer
from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.prompts import PromptEncoder
from gateway.verifier_client import VerifierClient

MESSAGES = [{"role": "user", "content": "Hi"}]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    address = f"127.0.0.1:{closed_port()}"
    config = GatewayConfig(verifier_addr=address, tokenizer="tiny-dir", model_name="tiny",
                           max_n=4, rpc_timeout_s=2.0, retry_attempts=2)
    verifier = VerifierClient(address, 10.0, 2.0, retry_attempts=2)
    app = create_app(config, verifier, PromptEncoder(build_tokenizer()))
    with TestClient(app) as test_client:
        yield test_client


def error_of(client: TestClient, path: str, body: dict[str, Any], status: int = 400) -> dict:
    reply = client.post(path, json=body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": MESSAGES, **fields}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"frobnicate": 1}, "frobnicate"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logit_bias": {"5": 10}}, "logit_bias"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 5}, "n"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": True, "x": 1}},
         "stream_options.x"),
        ({"ddtree": {"mode": "fast"}}, "ddtree.mode"),
        ({"ddtree": {"budget": 0}}, "ddtree.budget"),
        ({"ddtree": {"stream_granularity": "word"}}, "ddtree.stream_granularity"),
        ({"ddtree": {"bugdet": 8}}, "ddtree.bugdet"),
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
         "messages[0].content[0]"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ],
)
def test_bad_chat_parameters_are_400_naming_the_parameter(
    client: TestClient, fields: dict[str, Any], param: str
) -> None:
    error = error_of(client, "/v1/chat/completions", chat(**fields))
    assert error["param"] == param
    assert error["type"] == "invalid_request_error" and error["message"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [[1, 2], []]}, "prompt"),
        ({"prompt": [-1, 2]}, "prompt"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),  # 0 only with echo
        ({"prompt": "x", "suffix": "y"}, "suffix"),
        ({"prompt": "x", "best_of": 3}, "best_of"),
        ({"prompt": "x", "logprobs": 30}, "logprobs"),
        ({"prompt": ["a", "b", "c"], "n": 2}, "n"),
        ({"prompt": "x", "stop": 5}, "stop"),
    ],
)
def test_bad_completion_parameters_are_400(
    client: TestClient, fields: dict[str, Any], param: str
) -> None:
    assert error_of(client, "/v1/completions", {"model": "tiny", **fields})["param"] == param


def test_unsupported_parameters_with_neutral_values_are_accepted_by_validation(
    client: TestClient,
) -> None:
    # Gets past validation to the (down) verifier: 503, not 400.
    body = chat(presence_penalty=0, response_format={"type": "text"}, tool_choice="none",
                max_tokens=2)
    assert error_of(client, "/v1/chat/completions", body, status=503)["code"] == "unavailable"


def test_unknown_model_is_404_model_not_found(client: TestClient) -> None:
    error = error_of(client, "/v1/chat/completions", chat(model="gpt-4o"), status=404)
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    assert client.get("/v1/models/gpt-4o").status_code == 404


def test_invalid_json_is_400(client: TestClient) -> None:
    reply = client.post("/v1/chat/completions", content=b"{not json",
                        headers={"content-type": "application/json"})
    assert reply.status_code == 400
    assert "parse" in reply.json()["error"]["message"]


def test_a_verifier_that_is_down_is_503_and_health_says_so(client: TestClient) -> None:
    error = error_of(client, "/v1/completions", {"prompt": "Hi", "max_tokens": 2}, status=503)
    assert error["type"] == "service_unavailable_error"
    assert client.get("/health").status_code == 503


def test_x_request_id_is_echoed_or_generated(client: TestClient) -> None:
    reply = client.post("/v1/chat/completions", json=chat(n=99),
                        headers={"x-request-id": "req-42"})
    assert reply.headers["x-request-id"] == "req-42"
    generated = client.get("/v1/models").headers["x-request-id"]
    assert len(generated) == 32


def test_models_lists_the_served_model(client: TestClient) -> None:
    data = client.get("/v1/models").json()
    assert data["object"] == "list"
    assert [m["id"] for m in data["data"]] == ["tiny"]
    assert {"id", "object", "created", "owned_by"} <= data["data"][0].keys()


def test_unknown_routes_are_openai_errors(client: TestClient) -> None:
    reply = client.get("/v1/nothing")
    assert reply.status_code == 404 and "error" in reply.json()
