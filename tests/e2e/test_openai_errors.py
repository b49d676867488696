"""Errors as OpenAI error objects through the real stack: 400 for bad or unsupported
parameters (ours and the verifier's INVALID_ARGUMENT), 404 for an unknown model."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

MESSAGES = [{"role": "user", "content": "Hi"}]


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny-target"]
    assert models[0].object == "model" and models[0].owned_by
    assert client.models.retrieve("tiny-target").id == "tiny-target"


def test_unknown_model_is_404_model_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert info.value.code == "model_not_found" and info.value.param == "model"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4o", prompt="x")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
         "tools"),
        ({"frequency_penalty": 1.0}, "frequency_penalty"),
        ({"extra_body": {"ddtree": {"mode": "turbo"}}}, "ddtree.mode"),
        ({"extra_body": {"unknown_knob": 1}}, "unknown_knob"),
    ],
)
def test_unsupported_parameters_are_400_naming_them(
    client: openai.OpenAI, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny-target", messages=MESSAGES, **fields)
    assert info.value.param == param
    assert info.value.body["type"] == "invalid_request_error"


def test_the_verifiers_invalid_argument_is_400_with_its_message(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:  # above the verifier's max_budget
        client.chat.completions.create(model="tiny-target", messages=MESSAGES,
                                       extra_body={"ddtree": {"budget": 10_000}})
    assert info.value.code == "invalid_argument" and info.value.message


def test_past_the_model_length_is_400_before_the_verifier(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny-target", messages=MESSAGES, max_tokens=5000)
    assert info.value.code == "context_length_exceeded" and info.value.param == "max_tokens"


def test_out_of_vocabulary_token_ids_are_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny-target", prompt=[1, 2, 10**6], max_tokens=2)


def test_bad_json_is_400_and_errors_keep_the_request_id(stack: Any) -> None:
    reply = httpx.post(f"{stack.base_url}/v1/completions", content=b"{",
                       headers={"content-type": "application/json", "x-request-id": "bad-1"})
    assert reply.status_code == 400 and reply.headers["x-request-id"] == "bad-1"
    assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
