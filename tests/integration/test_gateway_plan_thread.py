"""Where the gateway plans a request (chat template, tokenization): a small body on the
event loop itself while the tokenizer thread is idle (no hop to a thread that must wait
for the GIL beside busy streams), a big body on the tokenizer thread, and any body there
while that thread still works on another (the tokenizer is never entered twice at once)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from starlette.requests import Request

from gateway.app import build_state
from gateway.config import parse_config
from gateway.state import INLINE_PLAN_BYTES, GatewayState
from gateway.verifier_client import VerifierClient


def state_of(tiny_pair: Path) -> GatewayState:
    config = parse_config(["--verifier-addr", "127.0.0.1:1", "--target",
                           str(tiny_pair / "target")], {})
    return build_state(config, VerifierClient(config.verifier_addr))  # never started


def request_of(size: int | None) -> Request:
    headers = [] if size is None else [(b"content-length", str(size).encode())]
    return Request({"type": "http", "method": "POST", "path": "/v1/completions",
                    "headers": headers})


def test_small_bodies_are_planned_on_the_loop_and_big_ones_on_the_tokenizer_thread(
        tiny_pair: Path) -> None:
    state = state_of(tiny_pair)

    def where(text: str) -> tuple[str, list[int]]:
        return threading.current_thread().name, state.encoder.encode_text(text)

    async def main() -> list[tuple[str, list[int]]]:
        loop_thread = threading.current_thread().name
        small = await state.plan(request_of(200), where, "a b c")
        edge = await state.plan(request_of(INLINE_PLAN_BYTES), where, "a b c")
        big = await state.plan(request_of(INLINE_PLAN_BYTES + 1), where, "a b c")
        unknown = await state.plan(request_of(None), where, "a b c")  # chunked: no length
        assert small[0] == edge[0] == loop_thread
        return [big, unknown]

    try:
        for thread, tokens in asyncio.run(main()):
            assert thread.startswith("tokenizer") and tokens == state.encoder.encode_text("a b c")
    finally:
        state.tokenizer_pool.shutdown()


def test_a_small_body_waits_its_turn_while_the_tokenizer_thread_works(tiny_pair: Path) -> None:
    state = state_of(tiny_pair)
    release = threading.Event()
    inside = 0
    most_inside = 0
    lock = threading.Lock()

    def plan(hold: bool) -> str:
        nonlocal inside, most_inside
        with lock:
            inside += 1
            most_inside = max(most_inside, inside)
        if hold:
            release.wait(10)
        with lock:
            inside -= 1
        return threading.current_thread().name

    async def main() -> tuple[str, str]:
        big = asyncio.ensure_future(state.plan(request_of(INLINE_PLAN_BYTES * 4), plan, True))
        await asyncio.sleep(0.05)  # the big one is on the tokenizer thread, held there
        small = asyncio.ensure_future(state.plan(request_of(10), plan, False))
        await asyncio.sleep(0.05)
        assert not small.done()  # queued behind the big one, not run beside it
        release.set()
        return await big, await small

    try:
        big_thread, small_thread = asyncio.run(main())
    finally:
        state.tokenizer_pool.shutdown()
    assert big_thread.startswith("tokenizer") and small_thread.startswith("tokenizer")
    assert most_inside == 1 and state.off_loop_jobs == 0
