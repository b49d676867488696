"""OpenAI response objects: chat.completion / text_completion bodies, their streamed
chunks, exact usage, and the per-request speculation stats (`ddtree_stats`)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any

from ddtree.v1 import common_pb2
from gateway.generation import ChoiceDelta, ChoiceResult
from gateway.logprobs import CompletionLogprobs, TokenNames, chat_logprobs
from gateway.params import Plan


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def sse(data: dict[str, Any]) -> bytes:
    """One server-sent event: `data: <json>` and the blank line."""
    return b"data: " + _json(data).encode() + b"\n\n"


def usage(plan: Plan, results: Sequence[ChoiceResult]) -> dict[str, int]:
    """Prompt tokens once per distinct prompt (n samples share it), completion tokens
    = the tokens returned (up to a stop string, stop tokens excluded)."""
    completion = sum(len(r.token_ids) for r in results)
    return {"prompt_tokens": plan.num_prompt_tokens, "completion_tokens": completion,
            "total_tokens": plan.num_prompt_tokens + completion}


def stats_json(stats: Sequence[common_pb2.SpecStats]) -> dict[str, Any]:
    """The choices' SpecStats summed into one object (one choice: exactly its own)."""
    histogram: list[int] = []
    stages: dict[str, float] = {}
    for s in stats:
        for i, count in enumerate(s.acceptance_histogram):
            histogram += [0] * (i + 1 - len(histogram))
            histogram[i] += count
        for stage, seconds in s.stage_seconds.items():
            stages[stage] = stages.get(stage, 0.0) + seconds
    num_rounds = sum(s.num_rounds for s in stats)
    committed = sum(i * count for i, count in enumerate(histogram))
    return {
        "mode": stats[0].mode if stats else "",
        "budget": stats[0].budget if stats else 0,
        "num_rounds": num_rounds,
        "mean_acceptance_length": round(committed / num_rounds, 4) if num_rounds else 0.0,
        "acceptance_histogram": histogram,
        "num_drafted_nodes": sum(s.num_drafted_nodes for s in stats),
        "num_accepted_draft_tokens": sum(s.num_accepted_draft_tokens for s in stats),
        "stage_seconds": {k: round(v, 6) for k, v in sorted(stages.items())},
    }


class Formatter:
    """Builds one request's bodies and chunks (same id and `created` throughout)."""

    def __init__(self, plan: Plan, names: TokenNames) -> None:
        self.plan = plan
        self.names = names
        self.created = int(time.time())
        is_chat = plan.kind == "chat"
        self.id = f"{'chatcmpl' if is_chat else 'cmpl'}-{plan.request_id}"
        self.object = "chat.completion" if is_chat else "text_completion"
        # Completions' text offsets run across a choice's chunks.
        self._offsets = {i: CompletionLogprobs(names) for i in range(len(plan.requests))}
        self._started: set[int] = set()
        # The common stream chunk (text only: no logprobs, reasoning or token ids) is
        # written around its text instead of built as a dict and dumped: the same bytes
        # (tests compare them), ~10 us less of the gateway's loop an event.
        output = plan.output
        self._is_plain = not (output.is_logprobs or output.is_reasoning
                              or output.return_token_ids)
        head = _json({"id": self.id, "object": f"{self.object}.chunk" if is_chat
                      else self.object, "created": self.created, "model": plan.model})
        self._head = f'data: {head[:-1]},"choices":[{{"index":'
        self._text_key = ',"delta":{"content":' if is_chat else ',"text":'
        self._text_end = '}' if is_chat else ''

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.plan.model,
                "choices": choices}

    def _logprobs(self, delta: ChoiceDelta) -> dict[str, Any] | None:
        if not self.plan.output.is_logprobs:
            return None
        if self.plan.kind == "chat":
            return chat_logprobs(delta.logprobs, self.names)
        return self._offsets[delta.index](delta.logprobs, delta.num_unscored)

    def _choice(self, delta: ChoiceDelta, is_stream: bool) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": delta.index}
        if self.plan.kind == "chat":
            message: dict[str, Any] = {}
            if not is_stream or delta.index not in self._started:
                message["role"] = "assistant"
            if not is_stream or delta.content or not delta.reasoning:
                message["content"] = delta.content
            if self.plan.output.is_reasoning and (not is_stream or delta.reasoning):
                message["reasoning_content"] = delta.reasoning or None
            choice["delta" if is_stream else "message"] = message
        else:
            choice["text"] = delta.content
        choice["logprobs"] = self._logprobs(delta)
        choice["finish_reason"] = delta.finish_reason
        if self.plan.output.return_token_ids:
            choice["token_ids"] = list(delta.token_ids)
            if self.plan.kind == "completion" and (not is_stream or delta.index not in
                                                   self._started):
                choice["prompt_token_ids"] = list(self.plan.requests[delta.index].prompt_ids)
        self._started.add(delta.index)
        return choice

    def chunk(self, delta: ChoiceDelta,
              so_far: Sequence[ChoiceResult] | None = None) -> dict[str, Any]:
        """One streamed chunk; `so_far` (continuous usage stats): the usage until now."""
        obj = "chat.completion.chunk" if self.plan.kind == "chat" else "text_completion"
        body = self._envelope(obj, [self._choice(delta, is_stream=True)])
        if so_far is not None:
            body["usage"] = usage(self.plan, so_far)
        return body

    def chunk_event(self, delta: ChoiceDelta,
                    so_far: Sequence[ChoiceResult] | None = None) -> bytes:
        """`chunk` as its server-sent event (`data: <json>` and the blank line)."""
        if (self._is_plain and so_far is None and not delta.reasoning
                and (delta.index in self._started or self.plan.kind != "chat")):
            finish = delta.finish_reason
            return (f'{self._head}{delta.index}{self._text_key}'
                    f'{encode_basestring(delta.content)}{self._text_end},"logprobs":null,'
                    f'"finish_reason":{"null" if finish is None else encode_basestring(finish)}'
                    '}]}\n\n').encode()
        return sse(self.chunk(delta, so_far))

    def usage_chunk(self, results: Sequence[ChoiceResult]) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.plan.kind == "chat" else "text_completion"
        body = self._envelope(obj, [])
        body["usage"] = usage(self.plan, results)
        body["ddtree_stats"] = stats_json([r.stats for r in results if r.stats is not None])
        return body

    def response(self, results: Sequence[ChoiceResult]) -> dict[str, Any]:
        ordered = sorted(results, key=lambda r: r.index)
        body = self._envelope(self.object, [self._choice(r, is_stream=False) for r in ordered])
        body["usage"] = usage(self.plan, ordered)
        body["ddtree_stats"] = stats_json([r.stats for r in ordered if r.stats is not None])
        if self.plan.kind == "chat" and self.plan.output.return_token_ids:
            body["prompt_token_ids"] = list(self.plan.requests[0].prompt_ids)
        return body
