"""Blocking generations run one at a time on one worker thread, so the asyncio load
generator can drive transformers' `generate` (the hf baseline) like a server: a request's
clock starts when it is submitted, so waiting for the model to be free counts as queueing,
as it would on a server with one slot."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ddtree.benchmark.sample import RequestSample


class SerialRunner:
    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def run(self, prompt_index: int,
                  generate: Callable[[RequestSample], None]) -> RequestSample:
        """`generate(sample)` fills the sample (chunk times, tokens, end) on the worker."""
        sample = RequestSample(prompt_index, start=time.perf_counter())
        await asyncio.get_running_loop().run_in_executor(self._executor, generate, sample)
        return sample

    def close(self) -> None:
        self._executor.shutdown(wait=True)
