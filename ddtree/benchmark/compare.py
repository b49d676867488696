"""`ddtree bench compare A.json B.json`: the rows the two reports share (same prompt set,
target, mode, budget, max_topk, load point, temperature), side by side with B / A ratios
of the headline numbers; rows found in one report only are listed after."""

from __future__ import annotations

from typing import Any

METRICS = (  # (title, row field, statistic)
    ("tok/s", "request_tok_s", "median"),
    ("thru", "output_throughput", "median"),
    ("ttft p50", ("latency_ms", "ttft"), "p50"),
    ("itl p50", ("latency_ms", "itl"), "p50"),
    ("tau", "acceptance_length", None),
)


def row_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["prompt_set"], row["target"], row["mode"], row["budget"], row["max_topk"],
            row["concurrency"], row["request_rate"], row["temperature"])


def _label(key: tuple[Any, ...]) -> str:
    prompt_set, target, mode, budget, topk, concurrency, rate, temperature = key
    spec = " ".join([mode] + [f"{p}{v}" for p, v in (("b", budget), ("k", topk)) if v is not None])
    load = f"c{concurrency}" if rate is None else f"r{rate}" + (f" c{concurrency}" if concurrency
                                                                 else "")
    return f"{prompt_set} {target} {spec} {load} T={temperature:g}"


def metric(row: dict[str, Any], field: str | tuple[str, str], stat: str | None) -> float | None:
    value: Any = row
    for part in (field,) if isinstance(field, str) else field:
        value = value.get(part) if isinstance(value, dict) else None
    if stat is not None:
        value = value.get(stat) if isinstance(value, dict) else None
    return None if value is None else float(value)


def _cell(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return f"{'-':>22}"
    ratio = f"{b / a:.2f}x" if a else "-"
    return f"{a:>8.1f} {b:>8.1f} {ratio:>6}"


def compare_reports(a: dict[str, Any], b: dict[str, Any]) -> str:
    rows_a = {row_key(r): r for r in a["rows"]}
    rows_b = {row_key(r): r for r in b["rows"]}
    shared = [k for k in rows_a if k in rows_b]
    width = max([len(_label(k)) for k in shared] + [10])
    header = f"{'row':<{width}}" + "".join(f" | {t + ' A, B, B/A':>22}" for t, _, _ in METRICS)
    lines = [header, "-" * len(header)]
    for key in shared:
        cells = [_cell(metric(rows_a[key], f, s), metric(rows_b[key], f, s)) for _, f, s in METRICS]
        lines.append(f"{_label(key):<{width}}" + "".join(f" | {c}" for c in cells))
    for name, mine, other in (("A", rows_a, rows_b), ("B", rows_b, rows_a)):
        for key in mine:
            if key not in other:
                lines.append(f"only in {name}: {_label(key)}")
    return "\n".join(lines)
