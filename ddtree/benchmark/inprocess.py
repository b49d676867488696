"""The engine in this process as a benchmark target: the ONE place the benchmark calls
`ddtree.engine.generate`. Today the engine runs one generation at a time, so concurrent
requests queue here (their latencies include the wait); a batched engine replaces
`_generate` and `SerialRunner` without touching the load generator or the report."""

from __future__ import annotations

import time
from typing import Any

from ddtree.benchmark.config import TREE_MODES, RequestSettings, SpecPoint
from ddtree.benchmark.sample import BenchPrompt, RequestSample
from ddtree.benchmark.serial import SerialRunner
from ddtree.engine import GenerationRequest, SpecParams, generate
from ddtree.errors import DDTreeError
from ddtree.models.drafter import DFlashDrafter
from ddtree.models.target import TargetModel
from ddtree.sampling import SamplingParams

MAX_PARALLEL = 1  # generations the in-process engine runs at once


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


class InProcessTarget:
    name = "inprocess"

    def __init__(self, target: TargetModel, drafter: DFlashDrafter | None, tokenizer: Any) -> None:
        self.target, self.drafter, self.tokenizer = target, drafter, tokenizer
        self.runner = SerialRunner("ddtree-bench-engine")

    def describe(self) -> dict[str, Any]:
        device = self.target.embeddings.embed_tokens.weight.device
        return {"kind": "inprocess", "device": str(device), "max_parallel": MAX_PARALLEL,
                "dtype": str(self.target.embeddings.embed_tokens.weight.dtype)}

    async def send(self, prompt: BenchPrompt, spec: SpecPoint,
                   settings: RequestSettings) -> RequestSample:
        def run(sample: RequestSample) -> None:
            self._generate(engine_request(prompt, spec, settings), sample)

        return await self.runner.run(prompt.index, run)

    def _generate(self, request: GenerationRequest, sample: RequestSample) -> None:
        tokens: list[int] = []
        stats = None
        try:
            for result, stats in generate(self.target, self.drafter, request):  # noqa: B007
                if result.new_tokens:  # committed tokens are host ints: the round has synced
                    sample.chunk_times.append(time.perf_counter())
                    tokens.extend(result.new_tokens)
        except DDTreeError as exc:
            sample.error = f"{type(exc).__name__}: {exc}"
        sample.end = time.perf_counter()
        sample.prompt_tokens = len(request.prompt_ids)
        sample.completion_tokens = len(tokens)
        sample.token_ids = tokens
        sample.text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        if stats is not None:
            sample.acceptance_histogram = stats.acceptance_histogram()
            sample.served_mode = stats.mode
            sample.served_budget = stats.budget if stats.mode in TREE_MODES else None

    async def aclose(self) -> None:
        self.runner.close()
