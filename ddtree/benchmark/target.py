"""What the load generator drives: anything that turns one prompt into one measured
request. Implemented by an OpenAI-compatible server over HTTP (`openai_target`), the
engine in this process (`inprocess`) and transformers' own `generate` (`hf_baseline`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ddtree.benchmark.config import RequestSettings, SpecPoint
from ddtree.benchmark.sample import BenchPrompt, RequestSample


@dataclass(frozen=True)
class RunBounds:
    """The most a whole bench run asks of one target, known before its first request: what
    the in-process engine is sized for (a server is sized by whoever started it)."""

    max_concurrency: int | None  # requests in flight at once; None: unbounded (open loop)
    max_prompt_tokens: int  # the longest encoded prompt (0 when prompts are not encoded)
    max_tokens: int
    max_budget: int | None  # the largest tree budget of its specs; None: only defaults


class Target(Protocol):
    name: str  # the row's `target`: inprocess | url | hf | baseline-url

    def describe(self) -> dict[str, Any]:
        """For the report's config: where it runs and what it serves."""
        ...

    async def prepare(self, bounds: RunBounds) -> None:
        """Called once per run before its first request."""
        ...

    async def send(self, prompt: BenchPrompt, spec: SpecPoint,
                   settings: RequestSettings) -> RequestSample:
        """One request, timed from just before it is sent; never raises for a failed
        request (the sample carries `error`)."""
        ...

    async def aclose(self) -> None: ...
