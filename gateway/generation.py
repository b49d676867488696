"""One choice, end to end on the gateway's side: the verifier's committed tokens ->
UTF-8-safe text -> stop strings -> reasoning / content split -> events (`ChoiceDelta`)
plus the accumulated `ChoiceResult`. `merge` interleaves the events of several choices.

Tokens are pushed through the detokenizer and the stop matcher one at a time, so the token
that completes a stop string is known exactly: the output, `completion_tokens` and the
logprobs all end there, and the verifier generation is aborted (it may have run ahead).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from ddtree.v1 import common_pb2, verifier_pb2
from gateway.detokenize import IncrementalDetokenizer
from gateway.errors import APIError
from gateway.metrics import Metrics
from gateway.params import OutputOptions
from gateway.reasoning import ReasoningSplitter, Split
from gateway.stops import StopMatcher
from gateway.verifier_client import VerifierClient


@dataclass
class ChoiceDelta:
    """What one event carries for one choice."""

    index: int
    content: str = ""
    reasoning: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[verifier_pb2.TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    # Leading `logprobs` entries that carry no logprob: an echoed prompt's first token.
    num_unscored: int = 0
    # When the verifier built the oldest message this event carries (its wall clock; 0:
    # unknown): the gateway times the way to the client's socket from it.
    sent_unix_s: float = 0.0

    def extend(self, other: ChoiceDelta) -> None:
        if not self.logprobs:
            self.num_unscored = other.num_unscored
        if not self.sent_unix_s:
            self.sent_unix_s = other.sent_unix_s
        self.content += other.content
        self.reasoning += other.reasoning
        self.token_ids += other.token_ids
        self.logprobs += other.logprobs
        self.finish_reason = other.finish_reason or self.finish_reason


@dataclass
class ChoiceResult(ChoiceDelta):
    """The whole choice once finished, with the verifier's speculation stats."""

    num_prompt_tokens: int = 0
    stats: common_pb2.SpecStats | None = None


class ChoiceRun:
    def __init__(
        self,
        index: int,
        request: verifier_pb2.GenerateRequest,
        client: VerifierClient,
        tokenizer: Any,
        output: OutputOptions,
        metrics: Metrics,
        started_at: float,
        echo_text: str = "",
    ) -> None:
        self.request, self.client, self.output = request, client, output
        self.metrics, self.started_at = metrics, started_at
        self.echo_text: str | None = echo_text if output.is_echo else None  # None: sent
        self.detokenizer = IncrementalDetokenizer(
            tokenizer, request.prompt_ids, output.skip_special_tokens
        )
        self.stops = StopMatcher(output.stops, output.include_stop_str)
        self.splitter = (
            ReasoningSplitter(output.starts_in_reasoning) if output.is_reasoning else None
        )
        self.result = ChoiceResult(index, num_prompt_tokens=len(request.prompt_ids))
        self.rounds: list[tuple[int, int]] = []  # (acceptance length, nodes) per round
        self._last_at: float | None = None
        self._gaps: list[tuple[float, int]] = []
        self._ttft_s: float | None = None
        # The verifier took the request (its first message came): only then does it count
        # as processed; a refusal is counted apart (gateway/errors.py).
        self.is_admitted = False

    async def deltas(self) -> AsyncGenerator[ChoiceDelta, None]:
        """The choice's events until it finishes; closing early aborts the generation.
        Round granularity: the messages that arrived while the last event was being sent
        make one event (one per message while the gateway keeps up; a busy gateway sends
        fewer, larger events instead of falling behind, as vLLM's output collector merges
        a request's pending outputs). Token granularity: one event per token always."""
        self.metrics.in_flight.labels(self.metrics.model_name).inc()
        try:
            merges = self.output.granularity == "round" and self.output.merge_when_behind
            batches = (self.client.generate_batches(self.request) if merges
                       else _one_by_one(self.client.generate(self.request)))
            started_unix_s = time.time()
            async with aclosing(batches):
                async for batch in batches:
                    self.metrics.observe_hop(batch[0].sent_unix_s)
                    if not self.is_admitted:
                        self.metrics.observe_first(started_unix_s, batch[0])
                    deltas: list[ChoiceDelta] = []
                    for message in batch:
                        self.is_admitted = True
                        self._time(len(message.token_ids))
                        deltas += self._deltas_of(message)
                        if self.result.finish_reason is not None:
                            if message.HasField("stats"):
                                self.result.stats = message.stats
                            break
                    for delta in self._granular(deltas):
                        yield delta
                    if self.result.finish_reason is not None:
                        break
                else:
                    raise APIError(502, "the verifier's stream ended without a finish "
                                        "reason")
        finally:
            self.metrics.in_flight.labels(self.metrics.model_name).dec()
            if self.is_admitted:
                self._record()

    async def collect(self) -> ChoiceResult:
        async for _ in self.deltas():
            pass
        return self.result

    def _echo(self, message: verifier_pb2.GenerateResponse) -> ChoiceDelta:
        """The prompt itself, first (completions' `echo`); with logprobs the target's
        logprob of each prompt token, none for the first."""
        delta = ChoiceDelta(self.result.index, content=self.echo_text or "")
        self.echo_text = None
        if self.output.is_logprobs and self.request.prompt_ids:
            first = verifier_pb2.TokenLogprob(token_id=self.request.prompt_ids[0])
            delta.logprobs = [first, *message.prompt_logprobs]
            delta.num_unscored = 1
        return delta

    def consume(self, message: verifier_pb2.GenerateResponse) -> list[ChoiceDelta]:
        """One verifier message (one or more rounds) -> its events at the output's
        granularity, as `deltas` makes them from a message handled alone."""
        return self._granular(self._deltas_of(message))

    def _deltas_of(self, message: verifier_pb2.GenerateResponse) -> list[ChoiceDelta]:
        """One verifier message -> one delta per token (accumulated into the result; the
        caller merges them per event: `_granular`)."""
        index, deltas = self.result.index, []
        if self.echo_text is not None:
            deltas.append(self._echo(message))
        self.rounds.extend(zip(message.acceptance_lengths, message.drafted_nodes, strict=True))
        if self.output.is_prompt_only:  # max_tokens 0: the one token asked for is dropped
            delta = deltas[0] if deltas else ChoiceDelta(index)
            delta.finish_reason = "length"
            return self._accumulate([delta])
        for i, token in enumerate(message.token_ids):
            text, is_stop = self.stops.feed(self.detokenizer.push([token]))
            delta = ChoiceDelta(index, token_ids=[token], logprobs=list(message.logprobs[i:i + 1]),
                                sent_unix_s=message.sent_unix_s)
            self._add_text(delta, text)
            deltas.append(delta)
            if is_stop:
                self._add_text(delta, "", is_last=True)
                delta.finish_reason = "stop"
                return self._accumulate(deltas)
        if message.finish_reason:
            last = deltas[-1] if deltas else ChoiceDelta(index, sent_unix_s=message.sent_unix_s)
            if not deltas:
                deltas.append(last)
            text, is_stop = self.stops.feed(self.detokenizer.flush())
            self._add_text(last, text + ("" if is_stop else self.stops.flush()), is_last=True)
            last.finish_reason = "stop" if is_stop else message.finish_reason
        return self._accumulate(deltas)

    def _accumulate(self, deltas: list[ChoiceDelta]) -> list[ChoiceDelta]:
        for delta in deltas:
            self.result.extend(delta)
        return deltas

    def _granular(self, deltas: list[ChoiceDelta]) -> list[ChoiceDelta]:
        """Token granularity: every token is an event, even one whose text is still held
        back (tools count events as tokens). Round granularity: one event for the deltas of
        the messages handled together (`deltas`: one, or those that queued meanwhile),
        none when it has nothing to show."""
        if self.output.granularity == "token" or not deltas:
            return deltas
        merged = deltas[0]
        for delta in deltas[1:]:
            merged.extend(delta)
        is_empty = not (merged.content or merged.reasoning or merged.finish_reason)
        if is_empty and not (self.output.is_logprobs or self.output.return_token_ids):
            return []
        return [merged]

    def _add_text(self, delta: ChoiceDelta, text: str, is_last: bool = False) -> None:
        if self.splitter is None:
            delta.content += text
            return
        split = self.splitter.feed(text)
        if is_last:
            rest = self.splitter.flush()
            split = Split(split.reasoning + rest.reasoning, split.content + rest.content)
        delta.content += split.content
        delta.reasoning += split.reasoning

    def _time(self, num_tokens: int) -> None:
        now = time.perf_counter()
        if num_tokens and self._ttft_s is None:
            self._ttft_s = now - self.started_at
        elif num_tokens and self._last_at is not None:
            self._gaps.append((now - self._last_at, num_tokens))
        if num_tokens:
            self._last_at = now

    def _record(self) -> None:
        result = self.result
        if result.stats is None:
            result.stats = fallback_stats(self.request, self.rounds)
        result.stats.num_completion_tokens = len(result.token_ids)
        self.metrics.observe_tokens(self._ttft_s, self._gaps)
        self.metrics.observe_choice(result.finish_reason or "", result.num_prompt_tokens,
                                    len(result.token_ids), time.perf_counter() - self.started_at)
        self.metrics.observe_stats(result.stats)


async def _one_by_one(messages: AsyncGenerator[verifier_pb2.GenerateResponse, None],
                      ) -> AsyncGenerator[list[verifier_pb2.GenerateResponse], None]:
    async for message in messages:
        yield [message]


def fallback_stats(
    request: verifier_pb2.GenerateRequest, round_figures: Sequence[tuple[int, int]]
) -> common_pb2.SpecStats:
    """Stats of a generation the gateway ended (stop string, client gone), rebuilt from
    each round message's (acceptance length, drafted nodes): the verifier sends its own
    totals only with the last message."""
    rounds = [length for length, _ in round_figures]
    histogram = [0] * (max(rounds, default=0) + 1)
    for size in rounds:
        histogram[size] += 1
    mode = common_pb2.Mode.Name(request.spec.mode).removeprefix("MODE_").lower()
    return common_pb2.SpecStats(
        mode="" if mode == "unspecified" else mode,
        budget=request.spec.budget,
        num_rounds=len(rounds),
        mean_acceptance_length=sum(rounds) / len(rounds) if rounds else 0.0,
        acceptance_histogram=histogram,
        num_accepted_draft_tokens=sum(max(0, s - 1) for s in rounds),
        num_drafted_nodes=sum(nodes for _, nodes in round_figures),
        num_prompt_tokens=len(request.prompt_ids),
    )


def merge(
    streams: Sequence[AsyncGenerator[ChoiceDelta, None]],
) -> AsyncGenerator[ChoiceDelta, None]:
    """Interleaves several choices' events as they come; the first error cancels all. One
    choice's events are its own generator (no layer between it and the response)."""
    return streams[0] if len(streams) == 1 else _interleave(streams)


async def _interleave(
    streams: Sequence[AsyncGenerator[ChoiceDelta, None]],
) -> AsyncGenerator[ChoiceDelta, None]:
    queue: asyncio.Queue[ChoiceDelta | BaseException | None] = asyncio.Queue()

    async def pump(stream: AsyncGenerator[ChoiceDelta, None]) -> None:
        try:
            async for delta in stream:
                await queue.put(delta)
            await queue.put(None)
        except Exception as exc:  # handed to the consumer, who maps it
            await queue.put(exc)
        finally:
            await stream.aclose()  # a cancelled pump still aborts its generation

    tasks = [asyncio.create_task(pump(s)) for s in streams]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()  # each stream's own cleanup aborts its generation
