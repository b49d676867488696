"""The gateway's incremental detokenizer and logprob token names, on the tiny pair's
byte-level BPE tokenizer (which splits é, ✓ and 😀 into one token per UTF-8 byte)."""

from __future__ import annotations

import pytest

from ddtree.models.tiny import build_tokenizer
from gateway.detokenize import REPLACEMENT, IncrementalDetokenizer
from gateway.logprobs import TokenNames

TEXTS = ("héllo wörld ✓ 😀 done", "def add(a, b):\n    return a + b  # → ∑", "日本語 🚀🚀 ok")


@pytest.fixture(scope="module")
def tokenizer():  # noqa: ANN201 (a transformers tokenizer)
    return build_tokenizer()


def encode(tokenizer, text: str) -> list[int]:  # noqa: ANN001
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("text", TEXTS)
def test_one_token_at_a_time_rebuilds_the_text_without_partial_characters(
    tokenizer, text: str  # noqa: ANN001
) -> None:
    ids = encode(tokenizer, text)
    detokenizer = IncrementalDetokenizer(tokenizer)
    pieces = [detokenizer.push([token]) for token in ids]
    pieces.append(detokenizer.flush())
    assert all(REPLACEMENT not in piece for piece in pieces)
    assert "".join(pieces) == text


def test_a_multi_byte_character_is_held_until_its_last_byte(tokenizer) -> None:  # noqa: ANN001
    ids = encode(tokenizer, "😀")
    assert len(ids) == 4  # one token per UTF-8 byte
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert [detokenizer.push([t]) for t in ids] == ["", "", "", "😀"]


@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_chunks_of_any_size_give_the_same_text(tokenizer, chunk: int) -> None:  # noqa: ANN001
    text = TEXTS[0]
    ids = encode(tokenizer, text)
    detokenizer = IncrementalDetokenizer(tokenizer)
    out = "".join(detokenizer.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk))
    assert out + detokenizer.flush() == text


def test_prompt_context_is_not_repeated_in_the_output(tokenizer) -> None:  # noqa: ANN001
    prompt = encode(tokenizer, "The quick brown fox")
    ids = encode(tokenizer, " jumps over ✓")
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids=prompt)
    out = "".join(detokenizer.push([t]) for t in ids) + detokenizer.flush()
    assert out == " jumps over ✓"


def test_special_tokens_are_skipped_unless_asked(tokenizer) -> None:  # noqa: ANN001
    ids = [*encode(tokenizer, "Hi"), tokenizer.convert_tokens_to_ids("<|im_end|>")]
    skipping = IncrementalDetokenizer(tokenizer)
    assert skipping.push(ids) + skipping.flush() == "Hi"
    keeping = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
    assert keeping.push(ids) + keeping.flush() == "Hi<|im_end|>"


def test_flush_releases_an_unfinished_character_as_replacement(tokenizer) -> None:  # noqa: ANN001
    first_byte = encode(tokenizer, "😀")[:1]
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert detokenizer.push(first_byte) == ""
    assert detokenizer.flush() == REPLACEMENT


def test_token_names_give_each_tokens_exact_bytes(tokenizer) -> None:  # noqa: ANN001
    names = TokenNames(tokenizer)
    text = "wörld 😀"
    raw = b"".join(bytes(names(t)[1]) for t in encode(tokenizer, text))
    assert raw == text.encode()
    assert names(tokenizer.convert_tokens_to_ids("<|im_end|>"))[0] == "<|im_end|>"


@pytest.fixture(scope="module")
def extended():  # noqa: ANN201 - the tiny tokenizer with added, non-special tokens
    tokenizer = build_tokenizer()
    tokenizer.add_tokens(["<extra>", " spaced x", "é"])  # "é" is also a byte stand-in
    return tokenizer


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_the_byte_level_path_gives_the_tokenizers_own_decode(extended, skip: bool,
                                                             seed: int) -> None:  # noqa: ANN001
    """Random ids (byte tokens that split characters, merges, special and added tokens,
    ids past the tokenizer): the pieces, pushed in random chunks, join to exactly what
    `tokenizer.decode` gives for the whole sequence, as the window path's pieces do."""
    import random

    rng = random.Random(seed)
    ids = [rng.randrange(len(extended) + 2) for _ in range(300)]
    expected = extended.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
    fast = IncrementalDetokenizer(extended, skip_special_tokens=skip)
    window = IncrementalDetokenizer(extended, skip_special_tokens=skip)
    window._bytes = None  # the decode-window path
    assert fast._bytes is not None
    outputs = {"fast": [], "window": []}
    at = 0
    while at < len(ids):
        size = rng.choice((1, 1, 1, 2, 5))
        for name, detokenizer in (("fast", fast), ("window", window)):
            outputs[name].append(detokenizer.push(ids[at:at + size]))
        at += size
    outputs["fast"].append(fast.flush())
    outputs["window"].append(window.flush())
    assert "".join(outputs["fast"]) == expected
    assert "".join(outputs["window"]) == expected


def test_a_tokenizer_that_is_not_byte_level_takes_the_window_path() -> None:
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    backend.decoder = decoders.WordPiece()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert detokenizer._bytes is None
    assert detokenizer.push([0, 1]) + detokenizer.flush() == tokenizer.decode([0, 1])
