"""The benchmark grid: each target prepared for the whole run first (its `RunBounds`), then
per prompt set, per target, per spec, per load point: warm-up (untimed), then `repeats`
measured runs; a progress bar on stderr; the `=ar` marks last."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from tqdm import tqdm

from ddtree.benchmark.config import BenchConfig, LoadPoint, SpecPoint
from ddtree.benchmark.load import run_load
from ddtree.benchmark.row import BenchRow, mark_matches_ar
from ddtree.benchmark.sample import BenchPrompt
from ddtree.benchmark.target import RunBounds, Target

# A client using this much CPU per wall second is said to (maybe) bound its figures; the
# targets that run the model in this process are left out (their CPU is the engine's too).
CLIENT_BOUND_CORES = 0.9
IN_PROCESS_TARGETS = ("inprocess", "hf")


@dataclass(frozen=True)
class TargetPlan:
    """A target and the specs and load points it runs (baselines run one spec)."""

    target: Target
    specs: Sequence[SpecPoint]
    loads: Sequence[LoadPoint]


def requests_per_run(config: BenchConfig, num_prompts: int, load: LoadPoint) -> int | None:
    """--num-requests; else every prompt once (at least one per worker), or None (until
    --duration) when only a duration bounds the run."""
    if config.num_requests is not None:
        return config.num_requests
    if config.duration_s is not None:
        return None
    return max(num_prompts, load.concurrency or 1)


def warmup_count(config: BenchConfig, load: LoadPoint) -> int:
    return config.warmup if config.warmup is not None else (load.concurrency or 1)


def total_requests(plans: Sequence[TargetPlan], prompt_sets: dict[str, list[BenchPrompt]],
                   config: BenchConfig) -> int | None:
    total = 0
    for prompts in prompt_sets.values():
        for plan in plans:
            for load in plan.loads:
                per_run = requests_per_run(config, len(prompts), load)
                if per_run is None:
                    return None
                total += per_run * config.repeats * len(plan.specs)
    return total


def max_in_flight(config: BenchConfig, num_prompts: int, load: LoadPoint) -> int | None:
    """Requests of one run in flight at once, at most (warm-up runs narrower); an open loop
    without a cap may have all of its requests in flight (None: unbounded)."""
    if load.concurrency is not None:
        return load.concurrency
    return requests_per_run(config, num_prompts, load)


def run_bounds(plan: TargetPlan, prompt_sets: dict[str, list[BenchPrompt]],
               config: BenchConfig) -> RunBounds:
    widths = [max_in_flight(config, len(prompts), load)
              for prompts in prompt_sets.values() for load in plan.loads]
    lengths = [len(p.token_ids) for prompts in prompt_sets.values() for p in prompts
               if p.token_ids is not None]
    budgets = [spec.budget for spec in plan.specs if spec.budget is not None]
    return RunBounds(
        max_concurrency=None if None in widths else max(w for w in widths if w is not None),
        max_prompt_tokens=max(lengths, default=0), max_tokens=config.settings.max_tokens,
        max_budget=max(budgets, default=None))


async def _measure(row: BenchRow, target: Target, prompts: list[BenchPrompt],
                   config: BenchConfig, bar: tqdm) -> None:
    spec, load = row.spec, row.load
    name = f"{row.prompt_set} {target.name} {spec.label} {load.label}"
    warmup = warmup_count(config, load)
    if warmup:
        bar.set_description(f"{name} warm-up")
        width = LoadPoint(min(warmup, load.concurrency or 1))
        await run_load(target, prompts, spec, width, config.settings, warmup, None)
    for repeat in range(config.repeats):
        bar.set_description(f"{name} {repeat + 1}/{config.repeats}")
        run = await run_load(
            target, prompts, spec, load, config.settings,
            requests_per_run(config, len(prompts), load), config.duration_s,
            repeat=repeat, seed=config.seed, on_sample=lambda _: bar.update(1))
        row.runs.append(run)
        cores = run.cpu_s / max(run.wall_s, 1e-9)
        if row.target not in IN_PROCESS_TARGETS and cores >= CLIENT_BOUND_CORES:
            print(f"note: {name} run {repeat + 1}: the benchmark client used {cores:.2f} "
                  "cores; one Python client near a full core may bound these figures "
                  "(--client-processes N sends from N processes)", file=sys.stderr)


async def run_bench(plans: Sequence[TargetPlan], prompt_sets: dict[str, list[BenchPrompt]],
                    config: BenchConfig, show_progress: bool = True) -> list[BenchRow]:
    config.validate()
    rows: list[BenchRow] = []
    for plan in plans:
        await plan.target.prepare(run_bounds(plan, prompt_sets, config))
    # disable=None: a bar on a terminal only, never \r-lines in a log file.
    with tqdm(total=total_requests(plans, prompt_sets, config), file=sys.stderr, unit="req",
              disable=None if show_progress else True, dynamic_ncols=True) as bar:
        for set_name, prompts in prompt_sets.items():
            for plan in plans:
                for spec in plan.specs:
                    for load in plan.loads:
                        row = BenchRow(set_name, plan.target.name, spec, load, config.settings)
                        await _measure(row, plan.target, prompts, config, bar)
                        rows.append(row)
    mark_matches_ar(rows)
    return rows
