"""One choice's pipeline on the gateway side (`ChoiceRun.consume`): verifier messages ->
UTF-8-safe text -> stop strings -> reasoning split -> events, per round or per token."""

from __future__ import annotations

from typing import Any

import pytest

from ddtree.models.tiny import build_tokenizer
from ddtree.v1 import verifier_pb2
from gateway.generation import ChoiceDelta, ChoiceRun
from gateway.metrics import Metrics
from gateway.params import OutputOptions
from gateway.verifier_client import VerifierClient


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    tokenizer = build_tokenizer()
    tokenizer.add_tokens(["<think>", "</think>"])  # as Qwen3's (not special: decoded)
    return tokenizer


def run_of(tokenizer: Any, **output: Any) -> ChoiceRun:
    request = verifier_pb2.GenerateRequest(request_id="r", prompt_ids=[5, 6])
    # Never started: consume() does no RPC.
    client = VerifierClient("127.0.0.1:1")
    return ChoiceRun(0, request, client, tokenizer, OutputOptions(**output), Metrics("m"), 0.0)


def feed(run: ChoiceRun, ids: list[int], round_size: int) -> list[ChoiceDelta]:
    """`ids` as verifier messages of `round_size` tokens, the last one finishing."""
    deltas = []
    for start in range(0, len(ids), round_size):
        is_last = start + round_size >= len(ids)
        message = verifier_pb2.GenerateResponse(
            token_ids=ids[start : start + round_size], finish_reason="length" if is_last else "")
        deltas += run.consume(message)
        if run.result.finish_reason:
            break
    return deltas


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("round_size", [1, 3, 8])
def test_reasoning_and_content_are_split_whatever_the_rounds(
    tokenizer: Any, round_size: int
) -> None:
    ids = encode(tokenizer, "<think>The sea is blue ✓</think>Waves 😀 roll.")
    run = run_of(tokenizer, is_reasoning=True)
    deltas = feed(run, ids, round_size)
    assert "".join(d.reasoning for d in deltas) == "The sea is blue ✓"
    assert "".join(d.content for d in deltas) == "Waves 😀 roll."
    assert all("\ufffd" not in d.content + d.reasoning for d in deltas)
    assert deltas[-1].finish_reason == "length"
    assert run.result.token_ids == ids


def test_token_granularity_gives_one_event_per_token(tokenizer: Any) -> None:
    ids = encode(tokenizer, "héllo wörld")
    deltas = feed(run_of(tokenizer, granularity="token"), ids, round_size=4)
    assert [d.token_ids for d in deltas] == [[t] for t in ids]
    assert "".join(d.content for d in deltas) == "héllo wörld"


def test_round_granularity_skips_rounds_with_nothing_to_show(tokenizer: Any) -> None:
    ids = encode(tokenizer, "😀")  # four byte tokens: nothing printable until the last
    deltas = feed(run_of(tokenizer), ids, round_size=1)
    assert [(d.content, d.finish_reason) for d in deltas] == [("😀", "length")]


@pytest.mark.parametrize("round_size", [1, 2, 5])
def test_a_stop_string_ends_the_choice_at_its_token(tokenizer: Any, round_size: int) -> None:
    text = "The dog sleeps. The fox jumps."
    ids = encode(tokenizer, text)
    run = run_of(tokenizer, stops=(". The",))
    deltas = feed(run, ids, round_size)
    assert "".join(d.content for d in deltas) == "The dog sleeps"
    assert deltas[-1].finish_reason == "stop" and run.result.finish_reason == "stop"
    # completion tokens end with the token that completed the stop string
    consumed = run.result.token_ids
    assert ". The" in tokenizer.decode(consumed)
    assert ". The" not in tokenizer.decode(consumed[:-1])


def test_held_back_text_is_released_when_the_generation_ends(tokenizer: Any) -> None:
    ids = encode(tokenizer, "ends with. T")
    deltas = feed(run_of(tokenizer, stops=(". The",)), ids, round_size=2)
    assert "".join(d.content for d in deltas) == "ends with. T"


def test_a_stop_token_finish_with_no_tokens_still_ends_the_choice(tokenizer: Any) -> None:
    run = run_of(tokenizer)
    deltas = run.consume(verifier_pb2.GenerateResponse(token_ids=[], finish_reason="stop"))
    assert [(d.content, d.finish_reason) for d in deltas] == [("", "stop")]
