"""The engine in this process as a benchmark target: ONE batched Engine per bench run,
built by `prepare` for the run's largest concurrency and longest request and driven by one
engine thread (engine_thread.py), so concurrent requests share its rounds as they would on
a server, and every request after the first reuses its KV pool and captured CUDA graphs."""

from __future__ import annotations

import itertools
import sys
import time
from typing import Any

from ddtree.benchmark.config import RequestSettings, SpecPoint
from ddtree.benchmark.engine_thread import EngineThread
from ddtree.benchmark.sample import BenchPrompt, RequestSample
from ddtree.benchmark.target import RunBounds
from ddtree.engine import MAX_BUDGET, Engine, EngineConfig, GenerationRequest, SpecParams
from ddtree.engine.generate import build_engine
from ddtree.errors import DDTreeError, InvalidArgumentError
from ddtree.models.drafter import DFlashDrafter
from ddtree.models.target import TargetModel
from ddtree.sampling import SamplingParams

# Room past the longest prompt + max_tokens of the run (the engine adds the trees' own).
MODEL_LEN_MARGIN = 16


def engine_request(prompt: BenchPrompt, spec: SpecPoint,
                   settings: RequestSettings) -> GenerationRequest:
    assert prompt.token_ids is not None, "in-process prompts are encoded up front"
    default = SpecParams()
    return GenerationRequest(
        prompt_ids=list(prompt.token_ids),
        max_tokens=settings.max_tokens,
        sampling=SamplingParams(settings.temperature, settings.top_k, settings.top_p,
                                settings.seed_for(prompt.index)),
        spec=SpecParams(spec.mode, spec.budget or default.budget, spec.max_topk),  # type: ignore[arg-type]
        ignore_eos=settings.ignore_eos,
    )


def engine_config(bounds: RunBounds) -> EngineConfig:
    """A row per request the run may have in flight (the engine's default when an open
    loop has no cap), each as long as the longest request; trees as large as the run's
    largest budget or the engine's default limit, whichever is larger."""
    default = EngineConfig()
    return EngineConfig(
        max_num_seqs=bounds.max_concurrency or default.max_num_seqs,
        max_model_len=bounds.max_prompt_tokens + bounds.max_tokens + MODEL_LEN_MARGIN,
        max_budget=min(MAX_BUDGET, max(default.max_budget, bounds.max_budget or 0)))


def warmed_up(engine: Engine) -> Engine:
    """On a GPU, every shape compiled and captured before the first request, as a server
    does before SERVING (`Engine.warm_up`): otherwise the first 307-token prompt of a run
    pays its prefill bucket's compiles (a 0.7 s first token in lease 13 call 49)."""
    if engine.graphs.enabled:
        engine.warm_up()
    return engine


class InProcessTarget:
    name = "inprocess"

    def __init__(self, target: TargetModel, drafter: DFlashDrafter | None, tokenizer: Any) -> None:
        self.target, self.drafter, self.tokenizer = target, drafter, tokenizer
        self.engine: Engine | None = None  # owned by the engine thread; read it when idle
        self._thread = EngineThread("ddtree-bench-engine")
        self._request_ids = itertools.count()

    def describe(self) -> dict[str, Any]:
        weight = self.target.embeddings.embed_tokens.weight
        max_parallel = self.engine.plan.num_slots if self.engine is not None else None
        return {"kind": "inprocess", "device": str(weight.device), "max_parallel": max_parallel,
                "dtype": str(weight.dtype)}

    async def prepare(self, bounds: RunBounds) -> None:
        config = engine_config(bounds)
        self.engine = await self._thread.install(
            lambda: warmed_up(build_engine(self.target, self.drafter, config)))
        num_slots = self.engine.plan.num_slots
        if bounds.max_concurrency is not None and num_slots < bounds.max_concurrency:
            print(f"ddtree bench: the KV budget holds {num_slots} generations at once; "
                  f"the rest of {bounds.max_concurrency} concurrent requests queue",
                  file=sys.stderr)

    async def send(self, prompt: BenchPrompt, spec: SpecPoint,
                   settings: RequestSettings) -> RequestSample:
        """Timed from before the request enters the engine's queue, so a wait for a free
        row counts, as on a server."""
        sample = RequestSample(prompt.index, start=time.perf_counter(), token_ids=[])
        request = engine_request(prompt, spec, settings)
        sample.prompt_tokens = len(request.prompt_ids)
        try:
            if spec.mode != "ar" and self.drafter is None:
                raise InvalidArgumentError(f"mode {spec.mode!r} needs a drafter")
            await self._thread.generate(f"bench-{next(self._request_ids)}", request, sample)
        except DDTreeError as exc:
            sample.error = f"{type(exc).__name__}: {exc}"
            sample.end = sample.end or time.perf_counter()
        assert sample.token_ids is not None
        sample.completion_tokens = len(sample.token_ids)
        sample.text = self.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
        return sample

    async def aclose(self) -> None:
        await self._thread.close()
