"""`unless_disconnected` runs the work in the caller's task: its result comes back, a
client that leaves ends it with ClientDisconnected only after it has unwound, and any other
cancellation stays a cancellation."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.dispatch import unless_disconnected
from gateway.errors import ClientDisconnected


class Client:
    """What `unless_disconnected` reads of a request: `receive`, which says the client
    left once `leave` is set."""

    def __init__(self) -> None:
        self.leave = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.leave.wait()
        return {"type": "http.disconnect"}


def test_the_work_s_result_comes_back_in_the_caller_s_task() -> None:
    async def main() -> None:
        caller = asyncio.current_task()

        async def work() -> asyncio.Task[Any] | None:
            await asyncio.sleep(0)
            return asyncio.current_task()

        assert await unless_disconnected(Client(), work()) is caller  # type: ignore[arg-type]

    asyncio.run(main())


def test_a_client_that_leaves_ends_the_work_after_it_unwound() -> None:
    events: list[str] = []

    async def main() -> None:
        client = Client()

        async def work() -> None:
            try:
                events.append("started")
                client.leave.set()
                await asyncio.sleep(60)
            finally:
                await asyncio.sleep(0)  # cleanup that awaits (an abort) still completes
                events.append("unwound")

        with pytest.raises(ClientDisconnected):
            await unless_disconnected(client, work())  # type: ignore[arg-type]
        events.append("raised")
        await asyncio.sleep(0)  # the caller's task is not left cancelled
        events.append("alive")

    asyncio.run(main())
    assert events == ["started", "unwound", "raised", "alive"]


def test_another_cancellation_stays_a_cancellation() -> None:
    async def main() -> None:
        async def call() -> None:
            await unless_disconnected(Client(), asyncio.sleep(60))  # type: ignore[arg-type]

        task = asyncio.ensure_future(call())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
