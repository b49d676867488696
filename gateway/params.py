"""OpenAI request -> `Plan`: the verifier GenerateRequests of every choice plus how to
post-process their tokens. Parameters we cannot honour are rejected here with a 400 that
says why; none is silently ignored (SERVING.md)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from ddtree.v1 import common_pb2, verifier_pb2
from gateway.config import Granularity
from gateway.errors import APIError, invalid_request, model_not_found, unsupported
from gateway.prompts import PromptEncoder
from gateway.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields

Kind = Literal["chat", "completion"]
_STRUCTURED = "structured output is not supported under speculative decoding yet"
_PENALTY = "penalties are not implemented by the verifier"
# name -> (the values that change nothing and are therefore accepted, why others are not).
_NEUTRAL: dict[str, tuple[tuple[Any, ...], str]] = {
    "frequency_penalty": ((0,), _PENALTY),
    "presence_penalty": ((0,), _PENALTY),
    "repetition_penalty": ((1,), _PENALTY),
    "logit_bias": (({},), "logit_bias is not implemented"),
    "min_p": ((0,), "min_p sampling is not implemented"),
    "min_tokens": ((0,), "min_tokens is not implemented"),
    "best_of": ((1,), "best_of is not implemented; use n"),
    "response_format": (({"type": "text"},), _STRUCTURED),
    "guided_json": ((), _STRUCTURED),
    "guided_regex": ((), _STRUCTURED),
    "guided_choice": ((), _STRUCTURED),
    "guided_grammar": ((), _STRUCTURED),
    "structured_outputs": ((), _STRUCTURED),
    "tools": (([],), "tool calling is not supported"),
    "tool_choice": (("none",), "tool calling is not supported"),
    "parallel_tool_calls": ((True, False), ""),
    "functions": (([],), "function calling is not supported"),
    "function_call": (("none",), "function calling is not supported"),
    "reasoning_effort": ((), "use chat_template_kwargs (e.g. enable_thinking) instead"),
    "modalities": ((["text"],), "only text output is supported"),
    "audio": ((), "only text output is supported"),
    "prediction": ((), "predicted outputs are not supported"),
    "web_search_options": ((), "web search is not supported"),
    "store": ((False,), "stored completions are not supported"),
    "service_tier": (("auto", "default"), "service tiers are not supported"),
    "spaces_between_special_tokens": ((True,), "only the default (true) is supported"),
    "suffix": (("",), "suffix (insertion) is not supported"),
}


@dataclass(frozen=True)
class OutputOptions:
    """How the gateway turns each choice's committed tokens into text and events."""

    stops: tuple[str, ...] = ()
    include_stop_str: bool = False
    skip_special_tokens: bool = True
    granularity: Granularity = "round"
    # round granularity: messages that queued while an event was sent go out as one event
    merge_when_behind: bool = True
    is_logprobs: bool = False
    return_token_ids: bool = False
    is_echo: bool = False  # completions: the prompt's text (and logprobs) come first
    is_prompt_only: bool = False  # max_tokens 0 with echo: the generated token is dropped
    is_reasoning: bool = False
    starts_in_reasoning: bool = False


@dataclass(frozen=True)
class Plan:
    kind: Kind
    request_id: str
    model: str
    requests: list[verifier_pb2.GenerateRequest]  # one per choice, in choice order
    output: OutputOptions
    is_stream: bool = False
    include_usage: bool = False
    include_continuous_usage: bool = False  # usage on every chunk (vLLM's extension)
    echo_texts: tuple[str, ...] = ()  # per choice, with OutputOptions.is_echo
    num_prompt_tokens: int = 0  # over the distinct prompts (n samples share one)
    client_request_id: str = ""  # the client's x-request-id (logged, never sent on)


@dataclass(frozen=True)
class Defaults:
    """What a request inherits: the served model's name and the checkpoint's sampling."""

    model: str
    sampling: dict[str, float]
    granularity: Granularity
    max_n: int
    merge_when_behind: bool = True


def check_unicode(value: Any, param: str = "") -> None:
    """400 naming the first string that is not valid Unicode (a lone surrogate such as
    "\\ud800" parses as JSON but cannot be tokenized or sent back)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise invalid_request(
                f"Invalid value for '{param}': it is not valid Unicode text (a lone surrogate "
                f"at character {exc.start})", param or None) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            check_unicode(key, param)
            check_unicode(item, f"{param}.{key}" if param else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_unicode(item, f"{param}[{i}]")


def check_context_length(plan: Plan, info: verifier_pb2.ModelInfo | None) -> None:
    """Prompt (+ max_tokens) against the model length, before anything reaches the verifier
    (which checks again; `info` None = the verifier is not reachable yet)."""
    if info is None or info.max_model_len <= 0:
        return
    limit = info.max_model_len
    prompt_param = "messages" if plan.kind == "chat" else "prompt"
    for request in plan.requests:
        num_prompt, num_new = len(request.prompt_ids), request.max_tokens
        if num_prompt >= limit:
            raise APIError(400, f"This model's maximum context length is {limit} tokens; the "
                                f"prompt has {num_prompt} tokens.", prompt_param,
                           "context_length_exceeded")
        if num_prompt + num_new > limit:
            raise APIError(400, f"This model's maximum context length is {limit} tokens; you "
                                f"requested {num_prompt + num_new} ({num_prompt} in the prompt, "
                                f"{num_new} to generate).", "max_tokens",
                           "context_length_exceeded")


def check_supported(body: SamplingFields) -> None:
    for name in sorted(body.model_fields_set & _NEUTRAL.keys()):
        value = getattr(body, name)
        neutral, why = _NEUTRAL[name]
        if value is not None and value not in neutral:
            raise unsupported(name, why)


def _check_common(body: SamplingFields, defaults: Defaults, num_prompts: int) -> None:
    check_unicode(body.model_dump(exclude_unset=True))
    if body.model is not None and body.model != defaults.model:
        raise model_not_found(body.model)
    check_supported(body)
    if body.stream_options is not None and not body.stream:
        raise invalid_request("stream_options is only allowed when stream is true",
                              "stream_options")
    if body.n * num_prompts > defaults.max_n:
        raise invalid_request(
            f"n x prompts = {body.n * num_prompts} exceeds this server's limit {defaults.max_n}",
            "n",
        )


def _sampling(body: SamplingFields, defaults: Defaults, index: int) -> common_pb2.SamplingParams:
    def pick(name: str, fallback: float) -> float:
        value = getattr(body, name)
        return float(value) if value is not None else defaults.sampling.get(name, fallback)

    msg = common_pb2.SamplingParams(
        temperature=pick("temperature", 1.0),  # OpenAI's default
        top_p=pick("top_p", 1.0),
        top_k=max(0, int(pick("top_k", 0))),  # vLLM's -1 ("off") is the proto's 0
    )
    if body.seed is not None:
        # Each of n samples gets its own stream, else they would all be the same sample.
        msg.seed = (body.seed + index) % 2**64
    return msg


def _spec(body: SamplingFields) -> common_pb2.SpecParams:
    options = body.ddtree
    if options is None:
        return common_pb2.SpecParams()
    mode = common_pb2.MODE_UNSPECIFIED  # the verifier's default
    if options.mode is not None:
        mode = common_pb2.Mode.Value(f"MODE_{options.mode.upper()}")
    return common_pb2.SpecParams(
        mode=mode, budget=options.budget or 0, max_topk=options.max_topk or 0
    )


def _stops(body: SamplingFields) -> tuple[str, ...]:
    if body.stop is None:
        return ()
    return (body.stop,) if isinstance(body.stop, str) else tuple(body.stop)


def _requests(
    body: SamplingFields,
    defaults: Defaults,
    request_id: str,
    prompts: list[list[int]],
    max_tokens: int | None,
    top_logprobs: int,
    is_prompt_logprobs: bool = False,
) -> list[verifier_pb2.GenerateRequest]:
    """One GenerateRequest per choice: prompt p, sample j is choice index p * n + j."""
    num_choices = len(prompts) * body.n
    requests = []
    for index in range(num_choices):
        requests.append(verifier_pb2.GenerateRequest(
            request_id=request_id if num_choices == 1 else f"{request_id}-{index}",
            prompt_ids=prompts[index // body.n],
            max_tokens=max_tokens or 0,  # 0: the verifier fills the model length
            sampling=_sampling(body, defaults, index),
            spec=_spec(body),
            stop_token_ids=body.stop_token_ids or [],
            ignore_eos=body.ignore_eos,
            logprobs=top_logprobs >= 0,  # -1 here means "no logprobs"
            top_logprobs=max(top_logprobs, 0),
            prompt_logprobs=is_prompt_logprobs,
        ))
    return requests


def _output(body: SamplingFields, defaults: Defaults, is_logprobs: bool) -> OutputOptions:
    granularity = defaults.granularity
    if body.ddtree is not None and body.ddtree.stream_granularity is not None:
        granularity = body.ddtree.stream_granularity
    return OutputOptions(
        stops=_stops(body),
        include_stop_str=body.include_stop_str_in_output,
        skip_special_tokens=body.skip_special_tokens,
        granularity=granularity,
        merge_when_behind=defaults.merge_when_behind,
        is_logprobs=is_logprobs,
        return_token_ids=body.return_token_ids,
    )


def _plan(
    kind: Kind, body: SamplingFields, defaults: Defaults, request_id: str,
    prompts: list[list[int]], max_tokens: int | None, top_logprobs: int, output: OutputOptions,
    echo_texts: tuple[str, ...] = (),
) -> Plan:
    options = body.stream_options
    include_usage = options is not None and options.include_usage
    return Plan(
        kind=kind,
        request_id=request_id,
        model=defaults.model,
        requests=_requests(body, defaults, request_id, prompts, max_tokens, top_logprobs,
                           is_prompt_logprobs=output.is_echo and output.is_logprobs),
        output=output,
        is_stream=body.stream,
        include_usage=include_usage,
        # As vLLM: continuous usage only together with include_usage.
        include_continuous_usage=include_usage and options is not None
        and options.continuous_usage_stats,
        num_prompt_tokens=sum(len(p) for p in prompts),
        echo_texts=echo_texts,
    )


def _joined_text(parts: list[dict[str, Any]], param: str) -> str:
    texts = []
    for j, part in enumerate(parts):
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise invalid_request(
                f"content part type {part.get('type')!r} is not supported (text only)",
                f"{param}[{j}]",
            )
        texts.append(part["text"])
    return "\n".join(texts)


def _message_dicts(body: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages as the chat template expects them: content parts joined into one string."""
    messages = []
    for i, message in enumerate(body.messages):
        data = message.model_dump(exclude_none=True)
        if isinstance(message.content, list):
            data["content"] = _joined_text(message.content, f"messages[{i}].content")
        messages.append(data)
    return messages


def plan_chat(
    body: ChatCompletionRequest, defaults: Defaults, encoder: PromptEncoder, request_id: str
) -> Plan:
    _check_common(body, defaults, 1)
    if body.echo not in (None, False):
        raise unsupported("echo", "echo is only supported on /v1/completions")
    if body.top_logprobs is not None and not body.logprobs:
        raise invalid_request("top_logprobs requires logprobs to be true", "top_logprobs")
    prompt = encoder.encode_chat(
        _message_dicts(body), body.add_generation_prompt, body.continue_final_message,
        body.chat_template_kwargs, add_special_tokens=bool(body.add_special_tokens),
    )
    top_logprobs = (body.top_logprobs or 0) if body.logprobs else -1
    output = replace(
        _output(body, defaults, body.logprobs),
        is_reasoning=encoder.is_reasoning,
        starts_in_reasoning=prompt.starts_in_reasoning,
    )
    max_tokens = body.max_completion_tokens or body.max_tokens
    return _plan("chat", body, defaults, request_id, [prompt.ids], max_tokens, top_logprobs,
                 output)


def _num_prompts(prompt: str | list[str] | list[int] | list[list[int]]) -> int:
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return 1
    return len(prompt)


def _completion_prompts(
    body: CompletionRequest, encoder: PromptEncoder
) -> tuple[list[list[int]], list[str]]:
    """`prompt` as a string, strings, token ids or lists of token ids -> (token id lists,
    their texts: as given, or decoded for token ids)."""
    prompt = body.prompt
    items: list[str | list[int]] = []
    if isinstance(prompt, str):
        items = [prompt]
    elif prompt and all(isinstance(p, int) for p in prompt):
        items = [[int(t) for t in prompt if isinstance(t, int)]]
    else:
        items = [p if isinstance(p, str) else [int(t) for t in p] if isinstance(p, list)
                 else [] for p in prompt]
    add_special = body.add_special_tokens is not False  # completions: BOS unless told not
    prompts = [encoder.encode_text(p, add_special) if isinstance(p, str) else p for p in items]
    if not prompts or any(not p for p in prompts):
        raise invalid_request("the prompt is empty", "prompt")
    texts = [p if isinstance(p, str) else encoder.decode(p, body.skip_special_tokens)
             for p in items] if body.echo else []
    return prompts, texts


def plan_completion(
    body: CompletionRequest, defaults: Defaults, encoder: PromptEncoder, request_id: str
) -> Plan:
    _check_common(body, defaults, _num_prompts(body.prompt))
    if body.max_tokens == 0 and not body.echo:
        raise invalid_request("max_tokens must be at least 1 (0 only with echo)", "max_tokens")
    prompts, texts = _completion_prompts(body, encoder)
    top_logprobs = body.logprobs if body.logprobs is not None else -1
    is_prompt_only = body.max_tokens == 0
    output = replace(_output(body, defaults, body.logprobs is not None), is_echo=body.echo,
                     is_prompt_only=is_prompt_only)
    # The verifier always generates at least one token: a prompt-only request asks for one
    # and the gateway drops it.
    max_tokens = 1 if is_prompt_only else body.max_tokens
    echo_texts = tuple(texts[i // body.n] for i in range(len(texts) * body.n))
    return _plan("completion", body, defaults, request_id, prompts, max_tokens, top_logprobs,
                 output, echo_texts)
