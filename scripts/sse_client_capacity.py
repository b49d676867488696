"""How many SSE events a second one `ddtree bench --url` client process can read: a
uvicorn server streams OpenAI-style chunks as fast as it can; the client reads 16 requests,
1, 4 and 8 at a time, with `OpenAITarget`'s reading loop (aiohttp; httpx before session
34). Prints events/s and the client's CPU per event (is the bench's client what bounds a
point?).

    PYTHONPATH=. python scripts/sse_client_capacity.py     # EVENTS=256 per request
    PACE_S=0.001 PYTHONPATH=. python scripts/sse_client_capacity.py   # one event a ms a stream
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import resource
import time
from collections.abc import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from ddtree.benchmark.openai_target import OpenAITarget, RequestSample

PORT = 8765
EVENTS = int(os.environ.get("EVENTS", "256"))
PACE_S = float(os.environ.get("PACE_S", "0"))  # between a stream's events (0: at once)
CHUNK = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": {"content": " tok"}, "logprobs": None,
                      "finish_reason": None}]}


def serve() -> None:
    event = b"data: " + json.dumps(CHUNK, separators=(",", ":")).encode() + b"\n\n"
    usage = dict(CHUNK, choices=[], usage={"prompt_tokens": 10, "completion_tokens": EVENTS,
                                           "total_tokens": EVENTS + 10})
    tail = b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n"

    async def body() -> AsyncIterator[bytes]:
        for _ in range(EVENTS):
            yield event
            await asyncio.sleep(PACE_S)
        yield tail

    async def chat(request: Request) -> StreamingResponse:
        await request.body()
        return StreamingResponse(body(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="error")


async def read(concurrency: int, requests: int) -> None:
    target = OpenAITarget(f"http://127.0.0.1:{PORT}", model="m")
    limit = asyncio.Semaphore(concurrency)

    async def one() -> int:
        async with limit:
            sample = RequestSample(0, start=time.perf_counter())
            async with target.session.post("/v1/chat/completions",
                                           json={"stream": True}) as reply:
                await target.read_events(reply, sample, True)
            return len(sample.chunk_times)

    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    events = sum(await asyncio.gather(*[one() for _ in range(requests)]))
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    print(f"c{concurrency}: {events} events in {wall:.2f} s = {events / wall:,.0f} events/s;"
          f" client CPU {cpu:.2f} s = {cpu / events * 1e6:.0f} us an event", flush=True)
    await target.aclose()


def main() -> None:
    server = multiprocessing.Process(target=serve, daemon=True)
    server.start()
    time.sleep(3)
    for concurrency in (1, 4, 8):
        asyncio.run(read(concurrency, 16))
    server.terminate()


if __name__ == "__main__":
    main()
