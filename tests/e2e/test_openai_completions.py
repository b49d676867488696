"""POST /v1/completions with every prompt form, stop strings (trimmed, verifier aborted)
and logprobs, through the official openai client."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest

PROMPT = "The quick brown fox"
MAX_TOKENS = 20


def complete(client: openai.OpenAI, prompt: Any, **fields: Any):  # noqa: ANN201 (Completion)
    extra = {"ignore_eos": True, "return_token_ids": True, **fields.pop("extra_body", {})}
    return client.completions.create(model="tiny-target", prompt=prompt, temperature=0,
                                     max_tokens=fields.pop("max_tokens", MAX_TOKENS),
                                     extra_body=extra, **fields)


def test_string_prompt_serves_greedy_tokens_with_exact_usage(
    client: openai.OpenAI, tokenizer: Any, greedy: Callable[[list[int], int], list[int]]
) -> None:
    reply = complete(client, PROMPT)
    prompt = list(tokenizer(PROMPT)["input_ids"])
    choice = reply.choices[0]
    assert choice.model_extra["prompt_token_ids"] == prompt
    assert choice.model_extra["token_ids"] == greedy(prompt, MAX_TOKENS)
    assert reply.usage.prompt_tokens == len(prompt)
    assert reply.usage.completion_tokens == MAX_TOKENS
    assert reply.object == "text_completion" and choice.finish_reason == "length"


def test_token_id_prompts_are_used_as_given(
    client: openai.OpenAI, greedy: Callable[[list[int], int], list[int]]
) -> None:
    prompt = [10, 20, 30, 40, 50]
    reply = complete(client, prompt)
    assert reply.choices[0].model_extra["token_ids"] == greedy(prompt, MAX_TOKENS)
    assert reply.usage.prompt_tokens == 5


def test_a_list_of_prompts_gives_one_choice_each_in_order(client: openai.OpenAI) -> None:
    prompts = [PROMPT, "Hello! How are you", "def add(a, b):"]
    reply = complete(client, prompts, max_tokens=8)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    for prompt, choice in zip(prompts, reply.choices, strict=True):
        assert choice.text == complete(client, prompt, max_tokens=8).choices[0].text
    assert reply.usage.completion_tokens == 24


def test_a_list_of_token_id_lists_with_n(client: openai.OpenAI) -> None:
    reply = complete(client, [[10, 20, 30], [40, 50]], max_tokens=4, n=2)
    assert len(reply.choices) == 4
    prompts = [c.model_extra["prompt_token_ids"] for c in reply.choices]
    assert prompts == [[10, 20, 30], [10, 20, 30], [40, 50], [40, 50]]
    assert reply.usage.prompt_tokens == 5  # each prompt once, shared by its n samples


def pick_stop(text: str) -> tuple[str, int]:
    """A 3-character stop string from the middle of `text` and where it first occurs."""
    for start in range(4, len(text) - 3):
        stop = text[start : start + 3]
        if "\ufffd" not in stop and stop.strip():
            return stop, text.index(stop)
    raise AssertionError(f"no stop string candidate in {text!r}")


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_are_trimmed_and_end_the_generation(
    client: openai.OpenAI, stack: Any, stream: bool
) -> None:
    full = complete(client, PROMPT, max_tokens=40, extra_body={"ddtree": {"mode": "ar"}})
    stop, at = pick_stop(full.choices[0].text)
    request_id = f"e2e-stop-{stream}"
    fields: dict[str, Any] = {"stop": ["never-in-output", stop], "max_tokens": 40,
                              "extra_headers": {"x-request-id": request_id}}
    if stream:
        chunks = list(complete(client, PROMPT, stream=True, **fields))
        text = "".join(c.choices[0].text for c in chunks)
        reason = chunks[-1].choices[0].finish_reason
    else:
        reply = complete(client, PROMPT, **fields)
        text, reason = reply.choices[0].text, reply.choices[0].finish_reason
        assert reply.usage.completion_tokens < 40
    assert (text, reason) == (full.choices[0].text[:at], "stop")


def test_include_stop_str_in_output(client: openai.OpenAI) -> None:
    full = complete(client, PROMPT, max_tokens=40).choices[0].text
    stop, at = pick_stop(full)
    reply = complete(client, PROMPT, max_tokens=40, stop=stop,
                     extra_body={"include_stop_str_in_output": True})
    assert reply.choices[0].text == full[: at + len(stop)]


def test_completion_logprobs_format(client: openai.OpenAI) -> None:
    logprobs = complete(client, PROMPT, max_tokens=5, logprobs=2).choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 5
    assert len(logprobs.text_offset) == 5 and logprobs.text_offset[0] == 0
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)
    assert max(logprobs.top_logprobs[0].values()) == pytest.approx(logprobs.token_logprobs[0])
