"""Incremental detokenization that never emits a partial character.

Byte-level BPE (Llama 3, Qwen, GPT-2) splits a multi-byte UTF-8 character over several
tokens; decoding a prefix of them yields U+FFFD. The detokenizer therefore decodes a short
window (a few already-emitted tokens plus the new ones) and emits the new text only once
it does not end in U+FFFD. Decoding the window together with the tokens before it also
keeps SentencePiece's leading-space handling right (the technique of vLLM's and TGI's
incremental detokenizers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

REPLACEMENT = "\ufffd"
# Prompt tokens decoded with the first generated ones, for the leading-space rules.
NUM_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Feed token ids as they are committed; get back only complete new text."""

    def __init__(
        self,
        tokenizer: Any,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = list(prompt_ids[-NUM_CONTEXT_TOKENS:])
        # ids[prefix_offset:read_offset] is decoded text already emitted (kept as context);
        # ids[read_offset:] are tokens whose text is not emitted yet.
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: Sequence[int]) -> str:
        return str(
            self.tokenizer.decode(
                list(ids),
                skip_special_tokens=self.skip_special_tokens,
                clean_up_tokenization_spaces=False,
            )
        )

    def push(self, token_ids: Sequence[int]) -> str:
        """Adds tokens; returns the text they complete ("" while a character is partial)."""
        self.ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of the generation: whatever is still held back, U+FFFD included."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self.read_offset == len(self.ids):
            return ""
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(self.ids[self.prefix_offset :])
        if not final and (len(full_text) <= len(prefix_text) or full_text.endswith(REPLACEMENT)):
            return ""  # nothing printable yet, or the last character is incomplete
        new_text = full_text[len(prefix_text) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return new_text
