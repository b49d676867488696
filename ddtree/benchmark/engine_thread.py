"""The in-process bench's engine thread: the ONE thread that touches the batched Engine
(it is not thread-safe), the way verifier_svc's scheduler drives it. It loops
`Engine.step()` while there is work; the asyncio side only posts jobs (build the engine,
add a request, abort one), run here between steps. Each step's outputs fill their requests'
samples on this thread, stamped with the moment `step()` returned: committed tokens are
host ints by then, so the round that produced them has finished on the device."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TypeVar

from ddtree.benchmark.config import TREE_MODES
from ddtree.benchmark.sample import RequestSample
from ddtree.engine import Engine, GenerationRequest, RoundResult
from ddtree.errors import DDTreeError
from ddtree.stats import GenerationStats

T = TypeVar("T")


class EngineStopped(DDTreeError):
    """The engine thread shut down while the request was still running."""


@dataclass
class _Generation:
    """One request in the batch; its sample is written on the engine thread only, and read
    by the asyncio side once `done` is resolved."""

    sample: RequestSample
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future[None]
    stats: GenerationStats | None = None


class EngineThread:
    def __init__(self, name: str) -> None:
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._engine: Engine | None = None  # the engine thread only, once built
        self._generations: dict[str, _Generation] = {}  # the engine thread only
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the asyncio side

    async def call(self, fn: Callable[[], T]) -> T:
        """Runs `fn` on the engine thread between steps; returns its result or raises."""
        future: Future[T] = Future()

        def job() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # handed to the awaiting caller
                    future.set_exception(exc)

        self._jobs.put(job)
        return await asyncio.wrap_future(future)

    async def install(self, build: Callable[[], Engine]) -> Engine:
        """Builds the engine on the engine thread (it is the thread that uses it)."""
        def swap() -> Engine:
            assert not self._generations, "the engine is replaced between runs only"
            self._engine = build()
            return self._engine

        return await self.call(swap)

    async def generate(self, request_id: str, request: GenerationRequest,
                       sample: RequestSample) -> None:
        """One generation in the running batch, until it finished: fills `sample`'s chunk
        times, token ids, end and stats. Raises what `add_request` raises (a DDTreeError:
        the request was refused), or a step's error."""
        loop = asyncio.get_running_loop()
        generation = _Generation(sample, loop, loop.create_future())

        def admit() -> None:
            assert self._engine is not None, "prepare() builds the engine before any request"
            self._engine.add_request(request_id, request)
            self._generations[request_id] = generation

        try:
            await self.call(admit)
            await generation.done
        except asyncio.CancelledError:
            self._jobs.put(lambda: self._abort(request_id))
            raise

    async def close(self) -> None:
        self._jobs.put(None)
        await asyncio.to_thread(self._thread.join)

    # ------------------------------------------------------------ the engine thread

    def _run(self) -> None:
        while True:
            for job in self._take_jobs(wait=not self._has_work()):
                if job is None:
                    self._fail_all(EngineStopped("the in-process engine was closed"))
                    return
                job()
            if self._has_work():
                self._step()

    def _has_work(self) -> bool:
        return self._engine is not None and self._engine.has_work

    def _take_jobs(self, wait: bool) -> list[Callable[[], None] | None]:
        """Every queued job; blocks for the first one when there is no work."""
        jobs = [self._jobs.get()] if wait else []
        while True:
            try:
                jobs.append(self._jobs.get_nowait())
            except queue.Empty:
                return jobs

    def _step(self) -> None:
        assert self._engine is not None
        try:
            # New rows' first tokens are timed when read, as a server sends them.
            outputs = self._engine.step(early=self._deliver_all)
        except Exception as exc:  # a bug, not a request's: every waiting send raises it
            self._fail_all(exc)
            return
        self._deliver_all(outputs)

    def _deliver_all(self, outputs: list[tuple[str, RoundResult]]) -> None:
        now = time.perf_counter()
        for request_id, result in outputs:
            self._deliver(request_id, result, now)

    def _deliver(self, request_id: str, result: RoundResult, now: float) -> None:
        generation = self._generations.get(request_id)
        if generation is None:
            return
        sample = generation.sample
        if result.new_tokens:
            sample.chunk_times.append(now)
            assert sample.token_ids is not None
            sample.token_ids.extend(result.new_tokens)
        generation.stats = result.stats
        if result.finished:
            del self._generations[request_id]
            self._finish(generation, now, None)

    def _finish(self, generation: _Generation, now: float, error: BaseException | None) -> None:
        sample, stats = generation.sample, generation.stats
        sample.end = now
        if stats is not None:
            sample.acceptance_histogram = stats.acceptance_histogram()
            sample.served_mode = stats.mode
            sample.served_budget = stats.budget if stats.mode in TREE_MODES else None
            sample.stage_seconds = dict(stats.stage_seconds)
        generation.loop.call_soon_threadsafe(_resolve, generation.done, error)

    def _abort(self, request_id: str) -> None:
        if self._engine is not None:
            self._engine.abort(request_id)
        self._generations.pop(request_id, None)

    def _fail_all(self, error: BaseException) -> None:
        now = time.perf_counter()
        for request_id, generation in list(self._generations.items()):
            self._abort(request_id)
            self._finish(generation, now, error)


def _resolve(done: asyncio.Future[None], error: BaseException | None) -> None:
    """On the event loop: a cancelled send has stopped waiting."""
    if done.done():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)
