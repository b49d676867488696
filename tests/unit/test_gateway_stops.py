"""Stop strings across chunk boundaries: trimmed, held back while undecided, earliest wins."""

from __future__ import annotations

import pytest

from gateway.stops import StopMatcher


def run(stops: list[str], chunks: list[str], include: bool = False) -> tuple[str, bool, int]:
    """-> (text emitted, whether a stop hit, index of the chunk that hit or -1)."""
    matcher = StopMatcher(stops, include)
    out = ""
    for i, chunk in enumerate(chunks):
        text, hit = matcher.feed(chunk)
        out += text
        if hit:
            return out, True, i
    return out + matcher.flush(), False, -1


@pytest.mark.parametrize("cut", range(1, 18))
def test_a_stop_string_split_anywhere_is_found_and_trimmed(cut: int) -> None:
    text = "Hello world. STOP here"
    assert run(["STOP"], [text[:cut], text[cut:]]) == ("Hello world. ", True, 1 if cut < 17 else 0)


def test_one_character_per_chunk() -> None:
    assert run(["\n\n"], list("ab\ncd\n\nef")) == ("ab\ncd", True, 6)


def test_the_earliest_of_several_stops_wins() -> None:
    assert run(["world", "lo"], ["Hello world"]) == ("Hel", True, 0)


def test_include_stop_keeps_the_stop_string() -> None:
    assert run(["END"], ["abcE", "ND tail"], include=True) == ("abcEND", True, 1)


def test_a_false_start_is_released_when_ruled_out() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("go ST") == ("go ", False)
    assert matcher.feed("ART") == ("START", False)


def test_held_text_is_flushed_at_the_end() -> None:
    assert run(["STOP"], ["the end ST"]) == ("the end ST", False, -1)


def test_no_stops_pass_text_through() -> None:
    matcher = StopMatcher([])
    assert matcher.feed("anything") == ("anything", False)
    assert StopMatcher([""]).feed("x") == ("x", False)
