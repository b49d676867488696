"""The SSE response's own ends: the client vanishing mid-send (OSError from the server's
send) ends the response quietly and closes the body, which aborts its generations."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from gateway.streaming import SSEResponse


def test_a_send_that_fails_mid_body_ends_quietly_and_closes_the_body() -> None:
    closed = []

    async def body() -> AsyncGenerator[bytes, None]:
        try:
            for i in range(10):
                yield b"data: %d\n\n" % i
        finally:
            closed.append(True)

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and len(sent) >= 3:
            raise OSError("connection reset")
        sent.append(message)

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(60)  # the client never says it left
        return {"type": "http.disconnect"}

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}}
    asyncio.run(SSEResponse(body())(scope, receive, send))
    assert [m["type"] for m in sent] == ["http.response.start"] + ["http.response.body"] * 2
    assert closed == [True]
