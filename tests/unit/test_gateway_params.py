"""OpenAI request -> the verifier GenerateRequests of each choice (params.plan_*), with the
tiny pair's tokenizer and ChatML template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddtree.models.tiny import build_tokenizer
from ddtree.v1 import common_pb2
from gateway.params import Defaults, plan_chat, plan_completion
from gateway.prompts import PromptEncoder, load_sampling_defaults
from gateway.schemas import ChatCompletionRequest, CompletionRequest

DEFAULTS = Defaults(model="tiny", sampling={}, granularity="round", max_n=8)
MESSAGES = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def encoder() -> PromptEncoder:
    return PromptEncoder(build_tokenizer())


def chat(encoder: PromptEncoder, defaults: Defaults = DEFAULTS, **fields):  # noqa: ANN201
    body = ChatCompletionRequest(model="tiny", messages=MESSAGES, **fields)
    return plan_chat(body, defaults, encoder, "rid")


def test_chat_prompt_is_the_rendered_template_tokenized(encoder: PromptEncoder) -> None:
    plan = chat(encoder)
    tokenizer = encoder.tokenizer
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    expected = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert list(plan.requests[0].prompt_ids) == expected
    assert plan.num_prompt_tokens == len(expected)
    assert plan.requests[0].request_id == "rid"


def test_text_content_parts_are_joined(encoder: PromptEncoder) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hel"},
                                          {"type": "text", "text": "lo"}]}]
    body = ChatCompletionRequest(messages=parts)
    joined = plan_chat(body, DEFAULTS, encoder, "r").requests[0].prompt_ids
    single = plan_chat(ChatCompletionRequest(messages=[{"role": "user", "content": "Hel\nlo"}]),
                       DEFAULTS, encoder, "r").requests[0].prompt_ids
    assert joined == single


def test_sampling_defaults_to_openai_and_maps_top_k(encoder: PromptEncoder) -> None:
    sampling = chat(encoder).requests[0].sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (1.0, 1.0, 0)
    assert not sampling.HasField("seed")
    sampling = chat(encoder, temperature=0, top_k=-1, top_p=0.5).requests[0].sampling
    assert (sampling.temperature, sampling.top_k, sampling.top_p) == (0.0, 0, 0.5)


def test_the_checkpoints_generation_config_sets_omitted_sampling(
    encoder: PromptEncoder, tmp_path: Path
) -> None:
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"temperature": 0.6, "top_k": 20, "eos_token_id": 2}))
    defaults = Defaults("tiny", load_sampling_defaults(str(tmp_path)), "round", 8)
    sampling = chat(encoder, defaults).requests[0].sampling
    assert (round(sampling.temperature, 4), sampling.top_k) == (0.6, 20)
    assert chat(encoder, defaults, temperature=0).requests[0].sampling.temperature == 0.0


def test_n_choices_get_their_own_ids_and_seeds(encoder: PromptEncoder) -> None:
    plan = chat(encoder, n=3, seed=7)
    assert [r.request_id for r in plan.requests] == ["rid-0", "rid-1", "rid-2"]
    assert [r.sampling.seed for r in plan.requests] == [7, 8, 9]
    assert plan.num_prompt_tokens == len(plan.requests[0].prompt_ids)


def test_max_completion_tokens_wins_over_max_tokens(encoder: PromptEncoder) -> None:
    assert chat(encoder, max_tokens=5).requests[0].max_tokens == 5
    assert chat(encoder, max_tokens=5, max_completion_tokens=9).requests[0].max_tokens == 9
    assert chat(encoder).requests[0].max_tokens == 0  # the verifier fills the model length


def test_ddtree_extension_and_passthrough_fields(encoder: PromptEncoder) -> None:
    plan = chat(encoder, ddtree={"mode": "shadow", "budget": 15, "max_topk": 8,
                                 "stream_granularity": "token"},
                stop="\n", stop_token_ids=[5], ignore_eos=True, logprobs=True, top_logprobs=3)
    request = plan.requests[0]
    assert (request.spec.mode, request.spec.budget, request.spec.max_topk) == (
        common_pb2.MODE_SHADOW, 15, 8)
    assert list(request.stop_token_ids) == [5] and request.ignore_eos
    assert request.logprobs and request.top_logprobs == 3
    assert plan.output.granularity == "token" and plan.output.stops == ("\n",)
    assert chat(encoder).requests[0].spec.mode == common_pb2.MODE_UNSPECIFIED
    assert not chat(encoder).requests[0].logprobs
    with_logprobs = chat(encoder, logprobs=True).requests[0]
    assert with_logprobs.logprobs and with_logprobs.top_logprobs == 0


def test_chat_template_kwargs_reach_the_template() -> None:
    tokenizer = build_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{% if enable_thinking %}<think>\n{% else %}<think></think>{% endif %}")
    tokenizer.add_tokens(["<think>", "</think>"])
    encoder = PromptEncoder(tokenizer)
    assert encoder.is_reasoning
    thinking = chat(encoder, chat_template_kwargs={"enable_thinking": True})
    plain = chat(encoder, chat_template_kwargs={"enable_thinking": False})
    assert thinking.output.starts_in_reasoning and thinking.output.is_reasoning
    assert not plain.output.starts_in_reasoning
    assert thinking.requests[0].prompt_ids != plain.requests[0].prompt_ids


@pytest.mark.parametrize(
    ("prompt", "num_prompts"),
    [("Hello", 1), (["Hello", "The dog"], 2), ([5, 6, 7], 1), ([[5, 6], [7]], 2)],
)
def test_completion_prompts_in_every_form(
    encoder: PromptEncoder, prompt: object, num_prompts: int
) -> None:
    body = CompletionRequest(model="tiny", prompt=prompt, n=2)
    plan = plan_completion(body, DEFAULTS, encoder, "c")
    assert len(plan.requests) == 2 * num_prompts
    # Choice p * n + j is sample j of prompt p.
    firsts = [list(plan.requests[2 * p].prompt_ids) for p in range(num_prompts)]
    assert [list(r.prompt_ids) for r in plan.requests[1::2]] == firsts
    if isinstance(prompt, list) and isinstance(prompt[0], list):
        assert firsts == prompt
    assert plan.num_prompt_tokens == sum(len(p) for p in firsts)


def test_the_gateway_accepts_exactly_the_engines_modes() -> None:
    from typing import get_args

    from ddtree.engine.request import MODES
    from gateway.schemas import Mode

    assert get_args(Mode) == MODES
