"""The target's logprobs (verifier TokenLogprob messages) in the two OpenAI formats:
chat `{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}` and completions
`{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`.

A token's `bytes` are its exact bytes: for byte-level BPE one token may hold half of a
UTF-8 character, which its text alone (U+FFFD) cannot show.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from ddtree.v1 import verifier_pb2

# JSON has no -inf; vLLM clamps the same way.
MIN_LOGPROB = -9999.0


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode table, inverted: printable stand-in character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


class TokenNames:
    """token id -> (text, bytes) for logprob entries, cached per id."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        self.is_byte_level = type(decoder).__name__ == "ByteLevel"
        self.special = set(getattr(tokenizer, "all_special_ids", []))
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        if token_id not in self._cache:
            self._cache[token_id] = self._name(token_id)
        return self._cache[token_id]

    def _name(self, token_id: int) -> tuple[str, list[int]]:
        if self.is_byte_level and token_id not in self.special:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            table = byte_decoder()
            if isinstance(piece, str) and piece and all(ch in table for ch in piece):
                raw = bytes(table[ch] for ch in piece)
                return raw.decode("utf-8", errors="replace"), list(raw)
        text = str(self.tokenizer.decode([token_id], clean_up_tokenization_spaces=False))
        return text, list(text.encode("utf-8"))


def _clamp(logprob: float) -> float:
    return max(float(logprob), MIN_LOGPROB) if not math.isnan(logprob) else MIN_LOGPROB


def chat_logprobs(
    entries: Sequence[verifier_pb2.TokenLogprob], names: TokenNames
) -> dict[str, Any]:
    content = []
    for entry in entries:
        text, raw = names(entry.token_id)
        top = []
        for alt in entry.top:
            alt_text, alt_raw = names(alt.token_id)
            top.append({"token": alt_text, "logprob": _clamp(alt.logprob), "bytes": alt_raw})
        content.append(
            {"token": text, "logprob": _clamp(entry.logprob), "bytes": raw, "top_logprobs": top}
        )
    return {"content": content, "refusal": None}


class CompletionLogprobs:
    """Builds the completions format chunk by chunk (text offsets run across chunks)."""

    def __init__(self, names: TokenNames) -> None:
        self.names = names
        self.offset = 0

    def __call__(self, entries: Sequence[verifier_pb2.TokenLogprob],
                 num_unscored: int = 0) -> dict[str, Any]:
        """`num_unscored`: leading entries without a logprob (an echoed prompt's first
        token): null in both lists, as OpenAI writes it."""
        tokens: list[str] = []
        values: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for i, entry in enumerate(entries):
            text, _ = self.names(entry.token_id)
            tokens.append(text)
            is_scored = i >= num_unscored
            values.append(_clamp(entry.logprob) if is_scored else None)
            tops.append({self.names(a.token_id)[0]: _clamp(a.logprob) for a in entry.top}
                        if is_scored else None)
            offsets.append(self.offset)
            self.offset += len(text)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
                "text_offset": offsets}
