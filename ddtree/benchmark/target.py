"""What the load generator drives: anything that turns one prompt into one measured
request. Implemented by an OpenAI-compatible server over HTTP (`openai_target`), the
engine in this process (`inprocess`) and transformers' own `generate` (`hf_baseline`)."""

from __future__ import annotations

from typing import Any, Protocol

from ddtree.benchmark.config import RequestSettings, SpecPoint
from ddtree.benchmark.sample import BenchPrompt, RequestSample


class Target(Protocol):
    name: str  # the row's `target`: inprocess | url | hf | baseline-url

    def describe(self) -> dict[str, Any]:
        """For the report's config: where it runs and what it serves."""
        ...

    async def send(self, prompt: BenchPrompt, spec: SpecPoint,
                   settings: RequestSettings) -> RequestSample:
        """One request, timed from just before it is sent; never raises for a failed
        request (the sample carries `error`)."""
        ...

    async def aclose(self) -> None: ...
