"""Prompt side of the tokenizer: chat template application, text prompts to token ids,
whether the model reasons in `<think>` tags, and the checkpoint's sampling defaults.

Chat prompts are rendered to text, then tokenized without extra special tokens: exactly
what `ddtree generate --chat` and the benchmark send, so all three agree token for token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from ddtree.errors import CheckpointError
from gateway.config import ReasoningSetting
from gateway.errors import invalid_request
from gateway.reasoning import THINK_END, THINK_START

# Arguments of apply_chat_template a request must not set through chat_template_kwargs.
_RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "tokenize",
    "add_generation_prompt", "continue_final_message", "return_dict", "return_tensors",
    "padding", "truncation", "max_length", "return_assistant_tokens_mask", "tokenizer_kwargs",
})
# The sampling keys of generation_config.json a request inherits when it omits them (as
# vLLM does): Qwen3's recommended temperature 0.6 instead of OpenAI's 1.0, for example.
_SAMPLING_KEYS = ("temperature", "top_p", "top_k")


@dataclass(frozen=True)
class ChatPrompt:
    ids: list[int]
    starts_in_reasoning: bool  # the template opened a <think> block for the model


class PromptEncoder:
    def __init__(self, tokenizer: Any, reasoning: ReasoningSetting = "auto") -> None:
        self.tokenizer = tokenizer
        vocab = tokenizer.get_vocab()
        has_tags = THINK_START in vocab and THINK_END in vocab
        self.is_reasoning = reasoning == "on" or (reasoning == "auto" and has_tags)

    @classmethod
    def load(cls, path: str, reasoning: ReasoningSetting = "auto") -> PromptEncoder:
        """The tokenizer of a local checkpoint directory; never a download (a path that
        does not exist is not a hub name here)."""
        from transformers import AutoTokenizer  # slow import: only where it is needed

        if not Path(path).is_dir():
            raise CheckpointError(f"tokenizer directory {path} does not exist")
        return cls(AutoTokenizer.from_pretrained(path, local_files_only=True), reasoning)

    def encode_text(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """A completions prompt: the tokenizer's own special tokens (BOS) included unless
        the request says `add_special_tokens: false`."""
        return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens,
                                         clean_up_tokenization_spaces=False))

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: dict[str, Any] | None = None,
        add_special_tokens: bool = False,
    ) -> ChatPrompt:
        kwargs = dict(template_kwargs or {})
        reserved = sorted(_RESERVED_TEMPLATE_KWARGS & kwargs.keys())
        if reserved:
            raise invalid_request(
                f"chat_template_kwargs may not set {reserved}", "chat_template_kwargs"
            )
        if add_generation_prompt and continue_final_message:
            raise invalid_request(
                "add_generation_prompt and continue_final_message cannot both be true",
                "continue_final_message",
            )
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                **kwargs,
            )
        except (jinja2.TemplateError, ValueError, TypeError, KeyError) as exc:
            raise invalid_request(f"the chat template rejected the messages: {exc}",
                                  "messages") from exc
        # The template already wrote the special tokens (vLLM's default for chat, too).
        ids = list(self.tokenizer(str(text), add_special_tokens=add_special_tokens)["input_ids"])
        opened = self.is_reasoning and str(text).rstrip().endswith(THINK_START)
        return ChatPrompt(ids, opened)


def load_sampling_defaults(path: str) -> dict[str, float]:
    """The sampling keys the checkpoint's generation_config.json sets explicitly."""
    file = Path(path) / "generation_config.json"
    if not file.is_file():
        return {}
    config = json.loads(file.read_text())
    return {key: float(config[key]) for key in _SAMPLING_KEYS if config.get(key) is not None}
