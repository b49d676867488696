"""<think>...</think> split into reasoning and content, with the tags cut across chunks."""

from __future__ import annotations

import pytest

from gateway.reasoning import ReasoningSplitter

OUTPUT = "<think>\nLet me think.\n</think>\n\nThe answer is 4."


def split(chunks: list[str], in_reasoning: bool = False) -> tuple[str, str]:
    splitter = ReasoningSplitter(in_reasoning)
    reasoning = content = ""
    for chunk in chunks:
        part = splitter.feed(chunk)
        reasoning, content = reasoning + part.reasoning, content + part.content
    rest = splitter.flush()
    return reasoning + rest.reasoning, content + rest.content


@pytest.mark.parametrize("cut", range(len(OUTPUT) + 1))
def test_tags_cut_at_any_point_split_the_same(cut: int) -> None:
    assert split([OUTPUT[:cut], OUTPUT[cut:]]) == ("\nLet me think.\n", "\n\nThe answer is 4.")


def test_one_character_per_chunk() -> None:
    assert split(list(OUTPUT)) == ("\nLet me think.\n", "\n\nThe answer is 4.")


def test_a_template_that_opened_the_block_starts_in_reasoning() -> None:
    assert split(["I reason</th", "ink>Answer"], in_reasoning=True) == ("I reason", "Answer")


def test_text_without_tags_is_all_content() -> None:
    assert split(["plain <thin", "g> text"]) == ("", "plain <thing> text")


def test_unterminated_reasoning_stays_reasoning() -> None:
    assert split(["<think>still thinking</thi"]) == ("still thinking</thi", "")


def test_nothing_is_emitted_while_a_tag_is_undecided() -> None:
    splitter = ReasoningSplitter()
    part = splitter.feed("Hi <thi")
    assert (part.reasoning, part.content) == ("", "Hi ")
    part = splitter.feed("nk>x")
    assert (part.reasoning, part.content) == ("x", "")
