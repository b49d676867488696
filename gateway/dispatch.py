"""Runs a Plan's choices on the verifier and answers: a JSON body, or an SSE stream whose
first chunk already exists when the response starts. A client that disconnects while we
wait (streaming or not) gets its generations aborted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from dataclasses import replace
from typing import TypeVar

import structlog
from fastapi import Request, Response
from fastapi.responses import JSONResponse

from gateway.errors import APIError, ClientDisconnected
from gateway.generation import ChoiceResult, ChoiceRun, merge
from gateway.params import Plan
from gateway.responses import Formatter
from gateway.state import GatewayState
from gateway.streaming import SSEResponse, events

log = structlog.get_logger("gateway")

T = TypeVar("T")
# Status nobody reads: the client is gone (nginx's convention).
CLIENT_CLOSED_REQUEST = 499
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Awaits `work` in the caller's task, cancelling it (and raising ClientDisconnected)
    if the client leaves meanwhile. Only the watch is a task of its own: a task for the
    work would cost the first token two turns of a busy event loop (its start, then its
    end reaching the caller), ~1 ms each at 8 ar streams."""
    task = asyncio.current_task()
    assert task is not None
    has_left = False

    def on_watch_done(watch: asyncio.Future[None]) -> None:
        nonlocal has_left
        if not watch.cancelled() and watch.exception() is None:
            has_left = True
            task.cancel()  # delivered inside `work`: nothing else is awaited here

    watch = asyncio.ensure_future(_wait_for_disconnect(request))
    watch.add_done_callback(on_watch_done)
    try:
        return await work
    except asyncio.CancelledError:
        if has_left and task.uncancel() == 0:  # ours alone: the work has unwound
            raise ClientDisconnected() from None
        raise
    finally:
        watch.remove_done_callback(on_watch_done)
        watch.cancel()


async def _collect(runs: Sequence[ChoiceRun]) -> list[ChoiceResult]:
    tasks = [asyncio.ensure_future(run.collect()) for run in runs]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()  # after the first error the others are aborted


def _log(plan: Plan, results: Sequence[ChoiceResult], started_at: float) -> None:
    log.info(
        "request_finished",
        request_id=plan.request_id,
        x_request_id=plan.client_request_id,
        kind=plan.kind,
        is_stream=plan.is_stream,
        num_choices=len(results),
        finish_reasons=[r.finish_reason for r in results],
        num_prompt_tokens=plan.num_prompt_tokens,
        num_completion_tokens=sum(len(r.token_ids) for r in results),
        seconds=round(time.perf_counter() - started_at, 4),
    )


async def respond(state: GatewayState, plan: Plan, request: Request) -> Response:
    started_at = time.perf_counter()
    arrived_at = getattr(request.state, "arrived_at", None)
    if arrived_at is not None:
        state.metrics.observe_prepare(started_at - arrived_at)
    plan = replace(plan, client_request_id=str(request.state.request_id))
    runs = [
        ChoiceRun(i, r, state.client, state.encoder.tokenizer, plan.output, state.metrics,
                  started_at, plan.echo_texts[i] if plan.echo_texts else "")
        for i, r in enumerate(plan.requests)
    ]
    formatter = Formatter(plan, state.names)
    try:
        if not plan.is_stream:
            results = await unless_disconnected(request, _collect(runs))
            _log(plan, results, started_at)
            return JSONResponse(formatter.response(results))
        stream = merge([run.deltas() for run in runs])
        try:
            first = await unless_disconnected(request, anext(stream))
        except BaseException:
            await stream.aclose()
            raise
    except ClientDisconnected:
        log.info("client_disconnected", request_id=plan.request_id,
                 x_request_id=plan.client_request_id)
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    except StopAsyncIteration as exc:
        raise APIError(502, "the verifier ended the generation without a result") from exc

    def finished() -> list[ChoiceResult]:
        _log(plan, [run.result for run in runs], started_at)
        return [run.result for run in runs]

    def so_far() -> list[ChoiceResult]:
        return [run.result for run in runs]

    body = events(first, stream, formatter, finished, plan.include_usage,
                  so_far if plan.include_continuous_usage else None,
                  state.metrics.observe_delivery)
    return SSEResponse(body, headers=SSE_HEADERS)
