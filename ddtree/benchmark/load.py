"""Load generators: closed loop (N workers, each sending its next prompt as soon as the
previous reply finished) and open loop (Poisson arrivals at a request rate, optionally at
most N in flight). Prompts are taken in order and cycled; no request starts after the
duration bound, and requests in flight then are awaited."""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from ddtree.benchmark.config import LoadPoint, RequestSettings, SpecPoint
from ddtree.benchmark.sample import BenchPrompt, RequestSample
from ddtree.benchmark.target import Target

OnSample = Callable[[RequestSample], None]


@dataclass
class RunResult:
    """One repeat of one (spec, load point): its samples and its wall time."""

    repeat: int
    start: float  # perf_counter at the run's start (samples' start_s are relative to it)
    wall_s: float
    samples: list[RequestSample]
    # CPU seconds of this process during the run (against a URL: the benchmark client's
    # own work; a client near one core bounds what it measures).
    cpu_s: float = 0.0


class _Schedule:
    """Hands out prompt indices until the count or the deadline is reached."""

    def __init__(self, num_prompts: int, num_requests: int | None,
                 duration_s: float | None) -> None:
        assert num_requests is not None or duration_s is not None, "unbounded run"
        self.order = itertools.cycle(range(num_prompts))
        self.left = math.inf if num_requests is None else num_requests
        self.deadline = math.inf if duration_s is None else time.perf_counter() + duration_s

    def next(self) -> int | None:
        if self.left <= 0 or time.perf_counter() >= self.deadline:
            return None
        self.left -= 1
        return next(self.order)


async def run_load(
    target: Target, prompts: Sequence[BenchPrompt], spec: SpecPoint, load: LoadPoint,
    settings: RequestSettings, num_requests: int | None, duration_s: float | None,
    repeat: int = 0, seed: int = 0, on_sample: OnSample | None = None,
) -> RunResult:
    client_cpu = _client_cpu(target)
    start, cpu = time.perf_counter(), client_cpu()
    schedule = _Schedule(len(prompts), num_requests, duration_s)
    samples: list[RequestSample] = []

    async def one(index: int) -> None:
        sample = await target.send(prompts[index], spec, settings)
        sample.repeat = repeat
        samples.append(sample)
        if on_sample is not None:
            on_sample(sample)

    if load.request_rate is None:
        assert load.concurrency is not None and load.concurrency >= 1

        async def worker() -> None:
            while (index := schedule.next()) is not None:
                await one(index)

        await asyncio.gather(*(worker() for _ in range(load.concurrency)))
    else:
        await _poisson(one, schedule, load, random.Random(seed * 1000 + repeat))
    return RunResult(repeat, start, time.perf_counter() - start, samples,
                     client_cpu() - cpu)


def _client_cpu(target: Target) -> Callable[[], float]:
    """A clock of the busiest client process's CPU seconds: this process's, or for a
    target that sends from several processes (`client_cpu_s`: one figure per process)
    the largest of their CPU seconds since this call."""
    per_process = getattr(target, "client_cpu_s", None)
    if per_process is None:
        return time.process_time
    base = per_process()
    return lambda: max(now - then for now, then in zip(per_process(), base, strict=True))


async def _poisson(one: Callable[[int], Awaitable[None]], schedule: _Schedule, load: LoadPoint,
                   rng: random.Random) -> None:
    assert load.request_rate is not None
    gate = asyncio.Semaphore(load.concurrency) if load.concurrency else None

    async def gated(index: int) -> None:
        if gate is None:
            await one(index)
            return
        async with gate:
            await one(index)

    tasks = []
    while (index := schedule.next()) is not None:
        tasks.append(asyncio.create_task(gated(index)))
        if not math.isinf(load.request_rate):
            await asyncio.sleep(rng.expovariate(load.request_rate))
    await asyncio.gather(*tasks)
