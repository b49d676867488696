"""A streamed chunk's server-sent event: the text-only fast path writes the same bytes as
the chunk built as a dict and dumped, for chat and completions, every kind of text."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ddtree.v1 import verifier_pb2
from gateway.generation import ChoiceDelta, ChoiceResult
from gateway.params import OutputOptions, Plan
from gateway.responses import Formatter, sse

TEXTS = ["Hello", "", ' "quoted" \\ back', "line\nbreak\ttab\r", "\x00\x1f\x7f", "é ü 中文 🚀",
         "\u2028\u2029", "</script>", "{\"a\": [1]}"]
FINISH = [None, None, "stop", "length", None]


def plan(kind: str, n: int = 2, model: str = "demo/Mödel \"x\"", **output: bool) -> Plan:
    requests = [verifier_pb2.GenerateRequest(prompt_ids=[1, 2, 3]) for _ in range(n)]
    return Plan(kind=kind, request_id="abc\"123", model=model,  # type: ignore[arg-type]
                requests=requests, output=OutputOptions(**output), is_stream=True)


def deltas() -> list[ChoiceDelta]:
    out = []
    for i, text in enumerate(TEXTS * 2):
        out.append(ChoiceDelta(i % 2, content=text, finish_reason=FINISH[i % len(FINISH)],
                               token_ids=[i]))
    return out


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_the_fast_path_writes_the_dumped_chunk(kind: str) -> None:
    fast, reference = Formatter(plan(kind), None), Formatter(plan(kind), None)  # type: ignore[arg-type]
    reference.created = fast.created
    for delta in deltas():
        event = fast.chunk_event(delta)
        assert event == sse(reference.chunk(delta))
        body = json.loads(event.removeprefix(b"data: "))
        assert body["choices"][0]["finish_reason"] == delta.finish_reason


def test_the_first_chat_chunk_names_the_role_and_later_ones_do_not() -> None:
    formatter = Formatter(plan("chat", n=1), None)  # type: ignore[arg-type]
    first = json.loads(formatter.chunk_event(ChoiceDelta(0, content="Hi")).removeprefix(b"data: "))
    later = json.loads(formatter.chunk_event(ChoiceDelta(0, content="!")).removeprefix(b"data: "))
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "Hi"}
    assert later["choices"][0]["delta"] == {"content": "!"}
    assert first["object"] == later["object"] == "chat.completion.chunk"


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_usage_and_token_ids_take_the_dumped_chunk(kind: str) -> None:
    so_far = [ChoiceResult(0, content="ab", token_ids=[5, 6])]
    with_ids = plan(kind, return_token_ids=True)
    for p, usage in ((plan(kind), so_far), (with_ids, None)):
        fast, reference = Formatter(p, None), Formatter(p, None)  # type: ignore[arg-type]
        reference.created = fast.created
        for delta in deltas()[:4]:
            assert fast.chunk_event(delta, usage) == sse(reference.chunk(delta, usage))
    body = json.loads(Formatter(with_ids, None).chunk_event(  # type: ignore[arg-type]
        ChoiceDelta(0, content="x", token_ids=[7])).removeprefix(b"data: "))
    assert body["choices"][0]["token_ids"] == [7]


def test_a_reasoning_delta_keeps_its_field() -> None:
    p = replace(plan("chat", n=1), output=OutputOptions(is_reasoning=True))
    formatter = Formatter(p, None)  # type: ignore[arg-type]
    formatter.chunk_event(ChoiceDelta(0, content="a"))
    body = json.loads(formatter.chunk_event(ChoiceDelta(0, reasoning="think"))
                      .removeprefix(b"data: "))
    assert body["choices"][0]["delta"] == {"reasoning_content": "think"}
