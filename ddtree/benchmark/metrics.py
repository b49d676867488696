"""Numbers from samples: pooled percentiles of per-request latencies, per-repeat
throughputs, their median / min / max across repeats, and acceptance length (tokens
committed per verify round, bonus included) from the summed acceptance histogram."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from statistics import median
from typing import Any

import numpy as np

from ddtree.benchmark.load import RunResult
from ddtree.benchmark.sample import RequestSample


def percentiles(values: Sequence[float], scale: float = 1.0) -> dict[str, float] | None:
    """p50 / p90 / p99 / mean (linear interpolation), times `scale`; None when empty."""
    if not values:
        return None
    p50, p90, p99 = np.percentile(np.asarray(values, dtype=float) * scale, [50, 90, 99])
    mean = float(np.mean(values)) * scale
    return {"p50": round(float(p50), 4), "p90": round(float(p90), 4),
            "p99": round(float(p99), 4), "mean": round(mean, 4)}


def spread(values: Sequence[float | None]) -> dict[str, float] | None:
    """median / min / max of the values that exist; None when none do."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return {"median": round(median(present), 4), "min": round(min(present), 4),
            "max": round(max(present), 4)}


def summarize_run(run: RunResult) -> dict[str, Any]:
    ok = [s for s in run.samples if s.is_ok]
    tokens = sum(s.completion_tokens for s in ok)
    rates = [r for s in ok if s.has_output and (r := s.tokens_per_second) is not None]
    wall = max(run.wall_s, 1e-9)
    return {
        "repeat": run.repeat,
        "wall_s": round(run.wall_s, 6),
        "num_requests": len(run.samples),
        "num_failed": len(run.samples) - len(ok),
        "completion_tokens": tokens,
        "output_throughput": round(tokens / wall, 4),
        "request_throughput": round(len(ok) / wall, 4),
        "request_tok_s": round(median(rates), 4) if rates else None,
        "client_cores": round(run.cpu_s / wall, 3),
    }


def latency_ms(samples: Iterable[RequestSample]) -> dict[str, dict[str, float] | None]:
    timed = [s for s in samples if s.has_output]
    return {
        "ttft": percentiles([s.ttft_s for s in timed], 1000.0),
        "tpot": percentiles([t for s in timed if (t := s.tpot_s) is not None], 1000.0),
        "itl": percentiles([x for s in timed for x in s.itl_s], 1000.0),
        "e2e": percentiles([s.e2e_s for s in timed], 1000.0),
    }


def summed_histogram(samples: Iterable[RequestSample]) -> list[int] | None:
    """Index i = verify rounds that committed i tokens, over every sample with stats."""
    total: list[int] | None = None
    for sample in samples:
        if sample.acceptance_histogram is None:
            continue
        total = total or []
        for i, count in enumerate(sample.acceptance_histogram):
            total += [0] * (i + 1 - len(total))
            total[i] += count
    return total


def acceptance_length(histogram: Sequence[int] | None) -> float | None:
    if not histogram or not sum(histogram):
        return None
    return round(sum(i * c for i, c in enumerate(histogram)) / sum(histogram), 4)
