"""`--sweep`: the best speculation setting for the measured workload, per load point, and
the `ddtree serve` flags that make it the server's default. A row that did not serve the ar
tokens at T=0 never wins; scores are averaged over the prompt sets of the run."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from statistics import mean
from typing import Any

from ddtree.benchmark.config import HF_MODE, SERVER_MODE, LoadPoint, SpecPoint
from ddtree.benchmark.row import MAIN_TARGETS, BenchRow

METRICS = {  # --sweep-metric -> the summary field whose median is maximised
    "request_tok_s": "request_tok_s",
    "throughput": "output_throughput",
}


def _score(row: BenchRow, field: str) -> float | None:
    value = row.summary()[field]
    return None if value is None else float(value["median"])


def best_specs(rows: Sequence[BenchRow], metric: str = "request_tok_s") -> list[dict[str, Any]]:
    field = METRICS[metric]
    scores: dict[LoadPoint, dict[SpecPoint, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row.target not in MAIN_TARGETS or row.spec.mode in (SERVER_MODE, HF_MODE):
            continue
        score = _score(row, field)
        if score is not None and row.matches_ar is not False:
            scores[row.load][row.spec].append(score)
    results = []
    for load, by_spec in scores.items():
        averaged = {spec: mean(values) for spec, values in by_spec.items()}
        best = max(averaged, key=lambda spec: averaged[spec])
        reference = {spec.mode: value for spec, value in averaged.items()
                     if spec.mode in ("ar", "linear")}
        results.append({
            "concurrency": load.concurrency,
            "request_rate": "inf" if load.request_rate == float("inf") else load.request_rate,
            "metric": metric,
            "mode": best.mode, "budget": best.budget, "max_topk": best.max_topk,
            "value": round(averaged[best], 4),
            "vs_ar": _ratio(averaged[best], reference.get("ar")),
            "vs_linear": _ratio(averaged[best], reference.get("linear")),
            "serve_flags": best.serve_flags(),
        })
    return results


def _ratio(value: float, reference: float | None) -> float | None:
    return round(value / reference, 4) if reference else None


def format_sweep(results: Sequence[dict[str, Any]]) -> str:
    lines = []
    for r in results:
        load = (f"concurrency {r['concurrency']}" if r["request_rate"] is None
                else f"request rate {r['request_rate']}/s")
        spec = SpecPoint(r["mode"], r["budget"], r["max_topk"]).label
        versus = ", ".join(f"{x:.2f}x {name}" for name, x in
                           (("linear", r["vs_linear"]), ("ar", r["vs_ar"])) if x is not None)
        lines.append(f"best at {load}: {spec} ({r['metric']} {r['value']:.1f}"
                     + (f"; {versus}" if versus else "") + ")")
        lines.append(f"  ddtree serve {r['serve_flags']}")
    return "\n".join(lines)
