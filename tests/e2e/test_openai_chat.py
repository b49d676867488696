"""POST /v1/chat/completions through the official openai client against the three real
processes: greedy losslessness, exact usage, streaming shape, the ddtree extension."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

MESSAGES = [{"role": "user", "content": "Write a short poem about the sea."}]
MAX_TOKENS = 24


def create(client: openai.OpenAI, **fields: Any):  # noqa: ANN201 (ChatCompletion)
    extra = {"ignore_eos": True, "return_token_ids": True, **fields.pop("extra_body", {})}
    return client.chat.completions.create(
        model="tiny-target", messages=fields.pop("messages", MESSAGES), temperature=0,
        extra_body=extra, **fields)


@pytest.mark.parametrize("mode", ["tree", "linear", "shadow", "ar"])
def test_temperature_zero_serves_the_targets_greedy_tokens(
    client: openai.OpenAI, tokenizer: Any, greedy: Callable[[list[int], int], list[int]],
    chat_prompt_ids: Callable[[list[dict[str, str]]], list[int]], mode: str,
) -> None:
    reply = create(client, max_tokens=MAX_TOKENS, extra_body={"ddtree": {"mode": mode}})
    prompt = chat_prompt_ids(MESSAGES)
    assert reply.model_extra["prompt_token_ids"] == prompt
    tokens = reply.choices[0].model_extra["token_ids"]
    assert tokens == greedy(prompt, MAX_TOKENS)
    assert reply.choices[0].message.content == tokenizer.decode(
        tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    assert reply.model_extra["ddtree_stats"]["mode"] == mode


def test_usage_is_exact(
    client: openai.OpenAI, chat_prompt_ids: Callable[[list[dict[str, str]]], list[int]]
) -> None:
    reply = create(client, max_completion_tokens=MAX_TOKENS)
    prompt = chat_prompt_ids(MESSAGES)
    usage = reply.usage
    assert usage.prompt_tokens == len(prompt)
    assert usage.completion_tokens == len(reply.choices[0].model_extra["token_ids"]) == MAX_TOKENS
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert reply.choices[0].finish_reason == "length"
    assert reply.object == "chat.completion" and reply.model == "tiny-target"


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_both_token_limits_are_honoured(client: openai.OpenAI, field: str) -> None:
    reply = create(client, **{field: 5})
    assert reply.usage.completion_tokens == 5 and reply.choices[0].finish_reason == "length"


def sse_events(stack_url: str, body: dict[str, Any]) -> tuple[httpx.Headers, list[str]]:
    """The raw SSE lines' payloads (everything after `data: `), checked for shape."""
    payloads = []
    with httpx.stream("POST", f"{stack_url}/v1/chat/completions", json=body,
                      timeout=120.0) as reply:
        assert reply.status_code == 200
        lines = list(reply.iter_lines())
    for i, line in enumerate(lines):
        if i % 2 == 1:
            assert line == "", "events are separated by one blank line"
        else:
            assert line.startswith("data: "), f"only data events (no comment pings): {line!r}"
            payloads.append(line[len("data: "):])
    return reply.headers, payloads


def stream_body(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny-target", "messages": MESSAGES, "temperature": 0, "stream": True,
            "max_tokens": MAX_TOKENS, "ignore_eos": True, **fields}


def test_streamed_chunks_are_well_formed_and_end_with_done(stack: Any) -> None:
    headers, payloads = sse_events(stack.base_url, stream_body())
    assert headers["content-type"].startswith("text/event-stream")
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert all(len(c["choices"]) == 1 and "usage" not in c for c in chunks)  # not asked for
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    reasons = [c["choices"][0]["finish_reason"] for c in chunks]
    assert reasons[-1] == "length" and reasons[:-1] == [None] * (len(reasons) - 1)


def test_streamed_text_equals_the_non_streamed_text(client: openai.OpenAI) -> None:
    whole = create(client, max_tokens=MAX_TOKENS).choices[0].message.content
    stream = create(client, max_tokens=MAX_TOKENS, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == whole


def test_usage_chunk_only_when_asked(client: openai.OpenAI, stack: Any) -> None:
    chunks = list(create(client, max_tokens=8, stream=True,
                         stream_options={"include_usage": True}))
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 8
    stats = chunks[-1].model_extra["ddtree_stats"]
    assert stats["num_rounds"] >= 1 and sum(stats["acceptance_histogram"]) == stats["num_rounds"]
    _, payloads = sse_events(stack.base_url, stream_body(max_tokens=8))
    assert all(json.loads(p)["choices"] for p in payloads[:-1])


def test_token_granularity_sends_one_event_per_token(client: openai.OpenAI) -> None:
    chunks = list(create(client, max_tokens=MAX_TOKENS, stream=True,
                         stream_options={"include_usage": True},
                         extra_body={"ddtree": {"stream_granularity": "token"}}))
    with_choices = [c for c in chunks if c.choices]
    assert len(with_choices) == MAX_TOKENS == chunks[-1].usage.completion_tokens
    assert all(len(c.choices[0].model_extra["token_ids"]) == 1 for c in with_choices)


def test_ddtree_extension_sets_mode_and_budget_per_request(client: openai.OpenAI) -> None:
    stats = create(client, max_tokens=12,
                   extra_body={"ddtree": {"mode": "tree", "budget": 4, "max_topk": 2}}
                   ).model_extra["ddtree_stats"]
    assert (stats["mode"], stats["budget"]) == ("tree", 4)
    # exactly `budget` nodes every round: the stack's drafter shares the verifier's round
    # state (the shared draft link, the default on one host), which stores a new row's
    # context before its first round (over the Draft stream that round verifies the root
    # alone while the drafter opens the row's session: RemoteDrafter.overlap_verify)
    assert stats["num_drafted_nodes"] == 4 * stats["num_rounds"]
    assert sum(stats["acceptance_histogram"]) == stats["num_rounds"]
    ar = create(client, max_tokens=6, extra_body={"ddtree": {"mode": "ar"}})
    assert ar.model_extra["ddtree_stats"]["num_drafted_nodes"] == 0
    default = create(client, max_tokens=6).model_extra["ddtree_stats"]
    assert (default["mode"], default["budget"]) == ("tree", 6)  # the verifier's defaults


def test_auto_mode_passes_the_gateway_and_serves_the_ar_tokens(client: openai.OpenAI) -> None:
    """`auto` (the tree size follows measured gain, down to ar) is a mode like the others
    at the gateway (it was refused as unknown); at T = 0 it serves ar's text."""
    auto = create(client, max_tokens=12, extra_body={"ddtree": {"mode": "auto"}})
    ar = create(client, max_tokens=12, extra_body={"ddtree": {"mode": "ar"}})
    assert auto.choices[0].message.content == ar.choices[0].message.content
    stats = auto.model_extra["ddtree_stats"]
    assert stats["mode"] in ("auto", "ar") and stats["num_rounds"] > 0


def test_n_choices_at_temperature_zero_agree(client: openai.OpenAI) -> None:
    reply = create(client, max_tokens=8, n=2)
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.choices[0].message.content == reply.choices[1].message.content
    assert reply.usage.completion_tokens == 16
    assert reply.usage.prompt_tokens == len(reply.model_extra["prompt_token_ids"])


def test_logprobs_are_the_targets(client: openai.OpenAI) -> None:
    reply = create(client, max_tokens=6, logprobs=True, top_logprobs=3)
    entries = reply.choices[0].logprobs.content
    assert len(entries) == 6
    for entry in entries:
        assert len(entry.top_logprobs) == 3
        # Greedy: the committed token is the target's most probable one.
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)
        assert entry.logprob <= 0.0


def test_x_request_id_is_echoed_but_the_verifier_gets_the_gateways_own_id(
    client: openai.OpenAI, stack: Any
) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="tiny-target", messages=MESSAGES, max_tokens=2,
        extra_headers={"x-request-id": "e2e-echo-1"})
    assert raw.headers["x-request-id"] == "e2e-echo-1"
    internal = raw.parse().id.removeprefix("chatcmpl-")
    assert internal != "e2e-echo-1" and len(internal) == 32  # uuid4: unguessable
    assert stack.verifier_events("generate_started", internal)
    assert not stack.verifier_events("generate_started", "e2e-echo-1")
    generated = client.chat.completions.with_raw_response.create(
        model="tiny-target", messages=MESSAGES, max_tokens=2)
    assert generated.headers["x-request-id"]


def test_streaming_n_choices_interleave_and_each_finishes(client: openai.OpenAI) -> None:
    chunks = list(create(client, max_tokens=8, n=2, stream=True,
                         stream_options={"include_usage": True}))
    texts = {0: "", 1: ""}
    finished = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            finished[choice.index] = choice.finish_reason
    assert finished == {0: "length", 1: "length"}
    assert texts[0] == texts[1] == create(client, max_tokens=8).choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 16
