"""The in-process bench target drives ONE batched engine for the whole run, from one
engine thread: at concurrency 1 and 3 every request serves exactly the tokens the engine
gives it alone (every row `=ar`), concurrency 3 really shares rounds, and a request the
engine refuses becomes a failed sample, not a crash."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from ddtree.benchmark.config import BenchConfig, LoadPoint, RequestSettings, SpecPoint
from ddtree.benchmark.inprocess import InProcessTarget, engine_request
from ddtree.benchmark.runner import TargetPlan, run_bench
from ddtree.benchmark.sample import BenchPrompt, RequestSample
from ddtree.benchmark.target import RunBounds
from ddtree.engine import generate
from ddtree.models.tiny import make_tiny_pair
from ddtree.runtime import load_pair

PROMPTS = ("hello", "the sea is", "one two three four five")
SPECS = (SpecPoint("ar"), SpecPoint("linear"), SpecPoint("tree", 6))
SETTINGS = RequestSettings(max_tokens=10, ignore_eos=True)  # every request runs 10 tokens
CONCURRENCY = 3


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Any]:
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("bench-inprocess")
    make_tiny_pair(root, family="qwen3")
    target, drafter = load_pair(root / "target", root / "drafter", torch.device("cpu"),
                                torch.float32)
    return target, drafter, AutoTokenizer.from_pretrained(root / "target")


@pytest.fixture(scope="module")
def prompts(pair: tuple[Any, Any, Any]) -> list[BenchPrompt]:
    tokenizer = pair[2]
    return [BenchPrompt(i, text, tuple(tokenizer(text)["input_ids"]))
            for i, text in enumerate(PROMPTS)]


@pytest.fixture(scope="module")
def bench(pair: tuple[Any, Any, Any], prompts: list[BenchPrompt]) -> dict[str, Any]:
    """One run: three specs at concurrency 1 and 3, no warm-up, one repeat."""
    inprocess = InProcessTarget(*pair)
    config = BenchConfig(SPECS, (LoadPoint(1), LoadPoint(CONCURRENCY)), SETTINGS, warmup=0)

    async def run() -> list[Any]:
        try:
            return await run_bench([TargetPlan(inprocess, SPECS, config.loads)],
                                   {"p": prompts}, config, show_progress=False)
        finally:
            await inprocess.aclose()

    rows = asyncio.run(run())
    return {"rows": rows, "engine": inprocess.engine, "describe": inprocess.describe()}


def peak_in_flight(samples: list[RequestSample]) -> int:
    events = sorted([(s.start, 1) for s in samples] + [(s.end, -1) for s in samples])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def test_each_request_serves_its_single_request_tokens_at_concurrency_1_and_3(
        bench: dict[str, Any], pair: tuple[Any, Any, Any], prompts: list[BenchPrompt]) -> None:
    target, drafter, _ = pair
    alone: dict[tuple[SpecPoint, int], list[int]] = {}
    for row in bench["rows"]:
        assert row.matches_ar is True, row.spec.label
        assert len(row.samples) == len(PROMPTS)
        for sample in row.samples:
            key = (row.spec, sample.prompt_index)
            if key not in alone:
                request = engine_request(prompts[sample.prompt_index], row.spec, SETTINGS)
                alone[key] = [t for result, _ in generate(target, drafter, request)
                              for t in result.new_tokens]
            assert sample.is_ok and sample.token_ids == alone[key], (row.load.label, key)
            assert sample.completion_tokens == SETTINGS.max_tokens
            assert sample.start < sample.chunk_times[0] <= sample.chunk_times[-1] == sample.end
            assert sample.served_mode == row.spec.mode and sample.num_rounds
            stages = sample.stage_seconds or {}  # the engine's own stage times
            assert stages.get("prefill", 0) > 0 and stages.get("verify", 0) > 0


def test_concurrency_3_runs_three_generations_in_the_rounds_of_one_engine(
        bench: dict[str, Any]) -> None:
    engine = bench["engine"]
    batch_sizes = engine.counters.batch_sizes
    assert batch_sizes[CONCURRENCY] > 0 and not any(batch_sizes[CONCURRENCY + 1:])
    assert bench["describe"]["max_parallel"] == CONCURRENCY
    for row in bench["rows"]:
        assert peak_in_flight(row.samples) == row.load.concurrency, row.load.label
    # Every request's rounds ran in this one engine (pipelining may add a dropped round).
    rows_verified = sum(width * n for width, n in enumerate(batch_sizes))
    assert rows_verified >= sum(s.num_rounds for row in bench["rows"] for s in row.samples)


def test_a_refused_request_is_a_failed_sample(pair: tuple[Any, Any, Any],
                                              prompts: list[BenchPrompt]) -> None:
    target, _, tokenizer = pair
    inprocess = InProcessTarget(target, None, tokenizer)

    async def run() -> tuple[RequestSample, RequestSample]:
        try:
            await inprocess.prepare(RunBounds(1, len(prompts[0].token_ids or ()), 4, None))
            tree = await inprocess.send(prompts[0], SpecPoint("tree", 6), SETTINGS)
            too_long = await inprocess.send(prompts[2], SpecPoint("ar"), SETTINGS)
            return tree, too_long
        finally:
            await inprocess.aclose()

    tree, too_long = asyncio.run(run())
    assert tree.error == "InvalidArgumentError: mode 'tree' needs a drafter"
    assert too_long.error is not None and "maximum model length" in too_long.error
    assert too_long.completion_tokens == 0 and too_long.end >= too_long.start
