"""Request bodies of the OpenAI API as pydantic models (shapes and ranges only).

Every model forbids unknown fields, so a misspelled or unsupported parameter is a 400 that
names it instead of being silently ignored. OpenAI parameters we do not implement are
declared here (typed `Any`) and rejected with a reason in `gateway/params.py` unless they
carry their neutral value (e.g. `presence_penalty: 0`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.config import Granularity

# The engine's modes (ddtree.engine.request.MODES; a test keeps the two equal).
Mode = Literal["ar", "linear", "tree", "shadow", "auto"]
# The wire's int32 fields (token ids, max_tokens, budgets) end at 2^31 - 1: a larger value
# is a 400 naming its parameter, never an overflow inside the gateway.
INT32_MAX = 2**31 - 1
UINT64_MAX = 2**64 - 1
NonNegInt = Annotated[int, Field(ge=0, le=INT32_MAX)]
PositiveInt = Annotated[int, Field(ge=1, le=INT32_MAX)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DDTreeOptions(Strict):
    """The per-request extension `ddtree: {...}`: speculation and streaming knobs."""

    mode: Mode | None = None  # None = the verifier's default
    budget: PositiveInt | None = None
    max_topk: PositiveInt | None = None
    stream_granularity: Granularity | None = None  # None = the gateway's default


class StreamOptions(Strict):
    include_usage: bool = False
    # vLLM's extension (benchmark clients send it): with include_usage, every chunk
    # carries the usage so far.
    continuous_usage_stats: bool = False


class SamplingFields(Strict):
    """What chat and completions requests share."""

    model: str | None = None  # None = the one served model
    max_tokens: PositiveInt | None = None
    temperature: Annotated[float, Field(ge=0.0, le=100.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=INT32_MAX)] | None = None  # -1 and 0: off
    seed: Annotated[int, Field(ge=0, le=UINT64_MAX)] | None = None
    n: PositiveInt = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[NonNegInt] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False  # vLLM's extension: token ids on the response
    add_special_tokens: bool | None = None  # vLLM's: BOS etc. (default: completions yes, chat no)
    spaces_between_special_tokens: Any = None  # vLLM's; only its default (true) is accepted
    ddtree: DDTreeOptions | None = None
    user: str | None = None  # metadata only
    # Declared only to be rejected with a reason unless neutral (see gateway/params.py).
    frequency_penalty: Any = None
    presence_penalty: Any = None
    repetition_penalty: Any = None
    logit_bias: Any = None
    min_p: Any = None
    min_tokens: Any = None
    best_of: Any = None
    response_format: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None


class ChatMessage(BaseModel):
    # Extra keys (name, reasoning_content, tool_call_id...) travel to the chat template.
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    # Parts are checked (text only) in gateway/params.py, which names the bad one.
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    # Declared only to be rejected with a reason unless neutral.
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    functions: Any = None
    function_call: Any = None
    reasoning_effort: Any = None
    modalities: Any = None
    audio: Any = None
    prediction: Any = None
    web_search_options: Any = None
    store: Any = None
    metadata: Any = None
    service_tier: Any = None
    echo: Any = None


TokenIds = list[NonNegInt]


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | TokenIds | list[TokenIds]
    # 0 only with echo: score the prompt, generate nothing (evaluation harnesses).
    max_tokens: NonNegInt | None = None
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: bool = False  # the prompt (and with logprobs its logprobs) before the completion
    suffix: Any = None
