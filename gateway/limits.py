"""What a client may cost the gateway before any route runs: a request head within
`header_timeout_s` (a connection that trickles its headers is closed), a body of at most
`max_request_bytes` (refused with 413 before it is read when Content-Length says so, else
as soon as it grows past the limit) arriving within `body_timeout_s` (else 408).

The body is read whole here and handed on; later `receive` calls go to the server, so the
routes still see the client's disconnect.
"""

from __future__ import annotations

import asyncio

import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from gateway.errors import APIError, count_rejection, error_response


class _TooLarge(Exception):
    pass


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float) -> None:
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    def _too_large(self) -> APIError:
        return APIError(413, f"The request body is larger than this server's limit of "
                             f"{self.max_bytes} bytes.", code="request_too_large")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(scope, receive, send, self._too_large())
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                messages = await self._read_body(receive)
        except _TooLarge:
            await self._refuse(scope, receive, send, self._too_large())
            return
        except TimeoutError:
            error = APIError(408, f"The request body did not arrive within {self.timeout_s:g} s.",
                             code="request_timeout")
            await self._refuse(scope, receive, send, error)
            return
        await self.app(scope, _replay(messages, receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, error: APIError) -> None:
        """The rest of the body is never read: the connection closes after the reply."""
        count_rejection(scope, error.status)
        await error_response(error, headers={"connection": "close"})(scope, receive, send)

    async def _read_body(self, receive: Receive) -> list[Message]:
        """The body's messages (an early http.disconnect ends the list)."""
        messages, size = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return messages
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                raise _TooLarge()
            if not message.get("more_body", False):
                return messages


def _replay(messages: list[Message], receive: Receive) -> Receive:
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]
    pending += [m for m in messages if m["type"] != "http.request"]

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed


def with_header_timeout(timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing connections whose request head takes longer than
    `timeout_s` (uvicorn itself only times out idle keep-alive connections)."""

    class HeaderTimeoutProtocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._disarm()  # the head is complete

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.conn.their_state is h11.IDLE:
                self._arm()  # waiting for the next request's head

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(timeout_s, self._on_timeout)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _on_timeout(self) -> None:
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutProtocol
