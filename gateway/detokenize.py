"""Incremental detokenization that never emits a partial character.

Byte-level BPE (Llama 3, Qwen, GPT-2) splits a multi-byte UTF-8 character over several
tokens; decoding a prefix of them yields U+FFFD. The detokenizer therefore decodes a short
window (a few already-emitted tokens plus the new ones) and emits the new text only once
it does not end in U+FFFD. Decoding the window together with the tokens before it also
keeps SentencePiece's leading-space handling right (the technique of vLLM's and TGI's
incremental detokenizers).

A byte-level BPE tokenizer (its decoder is ByteLevel) takes a faster path with the same
text: its decode is the UTF-8 reading (invalid sequences as U+FFFD) of the tokens' bytes
in order, each token's string mapped through GPT-2's byte table (a character outside it
stands for its own UTF-8 bytes, as in added tokens' content), skipped special tokens
contributing nothing. So each token's bytes are looked up once per tokenizer and fed to an
incremental UTF-8 decoder, which holds back an incomplete trailing character: no decode
call per token (two before; ~46 of the ~235 us a streamed event cost the gateway on the
CPU harness, scripts/profile_gateway.py).
"""

from __future__ import annotations

import codecs
import weakref
from collections.abc import Sequence
from typing import Any

from gateway.logprobs import byte_decoder

REPLACEMENT = "\ufffd"
# Prompt tokens decoded with the first generated ones, for the leading-space rules.
NUM_CONTEXT_TOKENS = 5


# tokenizer -> {skip_special_tokens: each token id's bytes} (byte-level tokenizers only)
_BYTE_TABLES: weakref.WeakKeyDictionary[Any, dict[bool, list[bytes]]] = (
    weakref.WeakKeyDictionary())


def byte_table(tokenizer: Any, skip_special_tokens: bool) -> list[bytes] | None:
    """Each token id's bytes in a decode (b"" for a skipped special token), or None when
    the tokenizer is not byte-level BPE (its decode then has rules of its own)."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if type(decoder).__name__ != "ByteLevel":
        return None
    tables = _BYTE_TABLES.setdefault(tokenizer, {})
    if skip_special_tokens not in tables:
        char_bytes = byte_decoder()
        special = {i for i, token in tokenizer.added_tokens_decoder.items() if token.special}
        table = []
        for token_id, piece in enumerate(tokenizer.convert_ids_to_tokens(
                list(range(len(tokenizer))))):
            if piece is None or (skip_special_tokens and token_id in special):
                table.append(b"")
            else:
                table.append(b"".join(bytes((char_bytes[ch],)) if ch in char_bytes
                                      else ch.encode() for ch in piece))
        tables[skip_special_tokens] = table
    return tables[skip_special_tokens]


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
        # Byte-level BPE: token bytes into an incremental UTF-8 decoder (no prompt context
        # needed: a byte-level decode has no leading-space rules).
        self._bytes = byte_table(tokenizer, skip_special_tokens)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
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
        table = self._bytes
        if table is not None:
            size = len(table)  # an id past the tokenizer (a padded vocabulary) decodes to ""
            return self._utf8.decode(b"".join(table[t] if 0 <= t < size else b""
                                              for t in token_ids))
        self.ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of the generation: whatever is still held back, U+FFFD included."""
        if self._bytes is not None:
            return self._utf8.decode(b"", final=True)
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
