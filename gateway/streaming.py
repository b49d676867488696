"""Server-sent events: `data: <json>\\n\\n` per chunk, `data: [DONE]\\n\\n` at the end, no
comment pings. The first chunk is produced before the response starts (nothing is sent
before the first token exists), and a client that disconnects ends the stream at once,
which aborts its generations on the verifier."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing

import anyio
import structlog
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.errors import as_api_error
from gateway.generation import ChoiceDelta, ChoiceResult
from gateway.responses import Formatter, sse

log = structlog.get_logger("gateway")

DONE = b"data: [DONE]\n\n"


async def events(
    first: ChoiceDelta,
    rest: AsyncGenerator[ChoiceDelta, None],
    formatter: Formatter,
    results: Callable[[], Sequence[ChoiceResult]],
    include_usage: bool,
    so_far: Callable[[], Sequence[ChoiceResult]] | None = None,
    delivered: Callable[[float], None] | None = None,
) -> AsyncGenerator[bytes, None]:
    """The SSE body: chunks, the usage chunk (only when asked), then [DONE]. An error
    after the first chunk can no longer change the HTTP status: it becomes an error event.
    `so_far` (continuous usage stats): every chunk carries the usage until then.
    `delivered`: told each chunk's `sent_unix_s` once the chunk is written (the response
    resumes this generator only then)."""

    def chunk(delta: ChoiceDelta) -> bytes:
        return formatter.chunk_event(delta, so_far() if so_far is not None else None)

    async with aclosing(rest):
        try:
            yield chunk(first)
            if delivered is not None:
                delivered(first.sent_unix_s)
            async for delta in rest:
                yield chunk(delta)
                if delivered is not None:
                    delivered(delta.sent_unix_s)
            final = results()
            if include_usage:
                yield sse(formatter.usage_chunk(final))
        except Exception as exc:
            error = as_api_error(exc)
            log.warning("stream_failed", request_id=formatter.plan.request_id,
                        status=error.status, reason=error.message)
            yield sse(error.body())
        except BaseException:  # cancelled or closed: the client went away
            log.info("client_disconnected", request_id=formatter.plan.request_id)
            raise
    yield DONE


class SSEResponse(StreamingResponse):
    """A StreamingResponse that always watches for the client's disconnect (whatever the
    server's ASGI version) and always closes its body, so generations are aborted."""

    media_type = "text/event-stream"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def listen_then_stop() -> None:
                    await self.listen_for_disconnect(receive)
                    group.cancel_scope.cancel()

                # The body is sent from this task: a task of its own would hold the first
                # chunk back for a turn of the event loop (~1 ms at 8 ar streams).
                group.start_soon(listen_then_stop)
                await self.stream_response(send)
                group.cancel_scope.cancel()
        except* OSError:
            pass  # the client vanished mid-send: the same as a disconnect (the task
            # group raises it in an ExceptionGroup)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()
