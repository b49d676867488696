"""The terminal table: one line per row, the headline numbers (medians across repeats,
[min-max] when repeated; latencies as pooled p50 / p99)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

COLUMNS = (  # (title, width)
    ("set", 11), ("target", 13), ("mode", 16), ("load", 8), ("tau", 6), ("tok/s", 20),
    ("thru tok/s", 12), ("ttft ms p50/p99", 17), ("itl ms p50", 11), ("e2e ms p50", 11),
    ("ok", 6), ("=ar", 4),
)


def _spread(value: dict[str, float] | None) -> str:
    if value is None:
        return "-"
    if value["min"] == value["max"]:
        return f"{value['median']:.1f}"
    return f"{value['median']:.1f} [{value['min']:.1f}-{value['max']:.1f}]"


def _pct(value: dict[str, float] | None, *keys: str) -> str:
    return "-" if value is None else "/".join(f"{value[k]:.1f}" for k in keys)


def _cells(row: dict[str, Any]) -> list[str]:
    knobs = (("b", "budget"), ("k", "max_topk"))
    label = " ".join([row["mode"]] + [f"{p}{row[f]}" for p, f in knobs if row[f] is not None])
    if row["mode"] == "server" and row["served_mode"]:  # what our gateway reports it ran
        label += f"={row['served_mode']}" + (f" b{row['served_budget']}"
                                             if row["served_budget"] else "")
    if row["request_rate"] is None:
        load = f"c{row['concurrency']}"
    else:
        load = f"r{row['request_rate']}" + (f" c{row['concurrency']}" if row["concurrency"] else "")
    tau = row["acceptance_length"]
    latency = row["latency_ms"]
    thru = row["output_throughput"]
    ok = row["num_requests"] - row["num_failed"]
    matches = row["matches_ar"]
    return [
        row["prompt_set"], row["target"], label, load,
        "?" if tau is None else f"{tau:.2f}", _spread(row["request_tok_s"]),
        "-" if thru is None else f"{thru['median']:.1f}",
        _pct(latency["ttft"], "p50", "p99"), _pct(latency["itl"], "p50"),
        _pct(latency["e2e"], "p50"), f"{ok}/{row['num_requests']}",
        "-" if matches is None else "yes" if matches else "NO",
    ]


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Rows as `BenchRow.summary()` dicts. tau `?`: the server reported no acceptance."""
    header = "".join(f"{title:<{width}}" for title, width in COLUMNS)
    lines = [header.rstrip(), "-" * len(header.rstrip())]
    for row in rows:
        cells = _cells(row)
        lines.append("".join(f"{cell:<{width}}" if len(cell) < width else cell + " "
                             for cell, (_, width) in zip(cells, COLUMNS, strict=True)).rstrip())
    return "\n".join(lines)
