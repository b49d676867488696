"""Several client processes behind one benchmark target (`ddtree bench --url ...
--client-processes N`).

One Python client streaming Server-Sent Events tops out near a core: at ar with 8 streams
through the gateway on the H200 host it used 0.9 of a core at ~7,300 events a second
(lease 14), so the figure may be the client's. Here each child process runs its own
`OpenAITarget` (its own HTTP connections, event parsing and clock) and the parent's load
generator stays what it is: its workers hand each request to the child with the fewest in
flight and await the finished sample (one message each way per request, none per token).
Samples are timed in the child with `time.perf_counter`, a clock every process of the host
shares, so TTFT, inter-token latency and the run's wall time mean what they do with one
client.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from ddtree.benchmark.config import RequestSettings, SpecPoint
from ddtree.benchmark.openai_target import OpenAITarget
from ddtree.benchmark.sample import BenchPrompt, RequestSample
from ddtree.benchmark.target import RunBounds
from ddtree.errors import DDTreeError

_POLL_S = 0.5  # how often the reader looks for a child that died
_START_TIMEOUT_S = 120.0  # a child's start: spawn and imports
_READY = "ready"


@dataclass(frozen=True)
class _ClientArgs:
    url: str
    name: str
    model: str | None
    api_key: str | None
    timeout_s: float
    extra_body: dict[str, Any]


def _child(args: _ClientArgs, index: int, requests: Any, results: Any) -> None:
    """A child's loop: every queued request runs as its own task until None arrives."""

    async def serve() -> None:
        target = OpenAITarget(args.url, args.name, args.model, args.api_key, args.timeout_s,
                              args.extra_body)
        results.put((_READY, index, time.process_time()))  # the parent may time requests now
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()

        async def one(key: int, prompt: BenchPrompt, spec: SpecPoint,
                      settings: RequestSettings) -> None:
            sample = await target.send(prompt, spec, settings)
            results.put((key, sample, time.process_time()))

        while (item := await loop.run_in_executor(None, requests.get)) is not None:
            task = asyncio.create_task(one(*item))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        await target.aclose()

    asyncio.run(serve())


class ClientPool:
    """A `Target` whose requests are sent by `num_processes` child processes, each with
    its own `OpenAITarget` for `target`'s server and model (call `target.start()` first)."""

    def __init__(self, target: OpenAITarget, num_processes: int) -> None:
        assert num_processes >= 1 and target.model is not None, "start the target first"
        self.name = target.name
        self._target = target
        context = mp.get_context("spawn")  # no fork of a process with threads and loops
        args = _ClientArgs(target.base_url, target.name, target.model, target.api_key,
                           target.timeout_s, target.extra_body)
        self._results = context.Queue()
        self._requests = [context.Queue() for _ in range(num_processes)]
        self._children = [context.Process(target=_child,
                                          args=(args, i, requests, self._results),
                                          name=f"bench-client-{i}", daemon=True)
                          for i, requests in enumerate(self._requests)]
        for child in self._children:
            child.start()
        self._cpu_s = [0.0] * num_processes  # each child's CPU seconds, as last reported
        self._wait_ready()
        self._keys = itertools.count()
        self._lock = threading.Lock()
        # key -> (future, its loop, child, prompt index, start)
        self._pending: dict[int, tuple[asyncio.Future[RequestSample],
                                       asyncio.AbstractEventLoop, int, int, float]] = {}
        self._in_flight = [0] * num_processes
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="bench-client-results",
                                        daemon=True)
        self._reader.start()

    def _wait_ready(self) -> None:
        """Blocks until every child has started (spawned, imported: seconds), so that no
        timed request waits for a child's start."""
        deadline = time.monotonic() + _START_TIMEOUT_S
        ready = 0
        while ready < self.num_processes:
            try:
                message = self._results.get(timeout=_POLL_S)
            except queue.Empty:
                dead = [child.name for child in self._children if not child.is_alive()]
                if dead or time.monotonic() > deadline:
                    for child in self._children:
                        child.kill()
                    raise DDTreeError(f"benchmark client processes did not start: "
                                      f"{dead or 'timed out'}") from None
                continue
            tag, child, cpu_s = message
            assert tag == _READY, message
            self._cpu_s[child] = cpu_s  # its start-up is not the runs' client CPU
            ready += 1

    @property
    def num_processes(self) -> int:
        return len(self._children)

    def describe(self) -> dict[str, Any]:
        return {**self._target.describe(), "client_processes": self.num_processes}

    async def prepare(self, bounds: RunBounds) -> None:
        await self._target.prepare(bounds)

    async def send(self, prompt: BenchPrompt, spec: SpecPoint,
                   settings: RequestSettings) -> RequestSample:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[RequestSample] = loop.create_future()
        alive = [i for i, child in enumerate(self._children) if child.is_alive()]
        if not alive:
            now = time.perf_counter()
            return RequestSample(prompt.index, start=now, end=now,
                                 error="every benchmark client process has exited")
        with self._lock:
            child = min(alive, key=self._in_flight.__getitem__)
            key = next(self._keys)
            self._pending[key] = (future, loop, child, prompt.index, time.perf_counter())
            self._in_flight[child] += 1
        self._requests[child].put((key, prompt, spec, settings))
        return await future

    def _read(self) -> None:
        while not self._closed:
            try:
                key, sample, cpu_s = self._results.get(timeout=_POLL_S)
            except queue.Empty:
                self._fail_dead_children()
                continue
            self._resolve(key, sample, cpu_s)

    def client_cpu_s(self) -> list[float]:
        """Each child's CPU seconds so far (as of its latest finished request): the run's
        `client_cores` is the busiest child's share of the wall time."""
        with self._lock:
            return list(self._cpu_s)

    def _resolve(self, key: int, sample: RequestSample, cpu_s: float | None = None) -> None:
        with self._lock:
            entry = self._pending.pop(key, None)
            if entry is None:
                return
            future, loop, child, _, _ = entry
            self._in_flight[child] -= 1
            if cpu_s is not None:
                self._cpu_s[child] = cpu_s
        loop.call_soon_threadsafe(_set_result, future, sample)

    def _fail_dead_children(self) -> None:
        """A request whose child died gets a failed sample (the run goes on)."""
        dead = {i for i, child in enumerate(self._children) if not child.is_alive()}
        if not dead:
            return
        with self._lock:
            lost = [(key, entry) for key, entry in self._pending.items() if entry[2] in dead]
        for key, (_, _, child, index, start) in lost:
            code = self._children[child].exitcode
            self._resolve(key, RequestSample(index, start=start, end=time.perf_counter(),
                                             error=f"client process {child} exited ({code})"))

    async def aclose(self) -> None:
        for requests in self._requests:
            requests.put(None)
        loop = asyncio.get_running_loop()
        for child in self._children:
            await loop.run_in_executor(None, child.join, 30)
            if child.is_alive():
                child.kill()
        self._closed = True
        await loop.run_in_executor(None, self._reader.join)
        await self._target.aclose()


def _set_result(future: asyncio.Future[RequestSample], sample: RequestSample) -> None:
    if not future.done():
        future.set_result(sample)
