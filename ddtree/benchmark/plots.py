"""`--plot DIR`: PNGs from a report's rows (matplotlib, Agg backend: no display needed).

- `budget_<set>_<load>.png`: per-request tok/s vs tree budget, one line per (mode,
  max_topk) of tree / shadow, ar and linear as horizontal references;
- `concurrency_<set>.png`: total throughput and per-request tok/s vs concurrency (closed
  loop), one line per spec and target;
- `acceptance_<set>.png`: share of verify rounds committing n tokens, per spec (bars).
Error bars span min..max across repeats.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (the backend must be chosen first)
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.ticker import MaxNLocator, ScalarFormatter  # noqa: E402

REFERENCE_STYLES = ("--", ":", "-.")  # horizontal lines of the rows without a budget


def _label(row: dict[str, Any]) -> str:
    parts = [row["mode"]]
    if row["budget"] is not None:
        parts.append(f"b{row['budget']}")
    if row["max_topk"] is not None:
        parts.append(f"k{row['max_topk']}")
    if row["target"] not in ("inprocess", "url"):
        parts.insert(0, row["target"])
    return " ".join(parts)


def _load(row: dict[str, Any]) -> str:
    if row["request_rate"] is None:
        return f"c{row['concurrency']}"
    return f"r{row['request_rate']}" + (f"c{row['concurrency']}" if row["concurrency"] else "")


def _errorbar(ax: Axes, xs: list[float], spreads: list[dict[str, float]], label: str) -> None:
    ys = [s["median"] for s in spreads]
    low = [s["median"] - s["min"] for s in spreads]
    high = [s["max"] - s["median"] for s in spreads]
    ax.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3, label=label)


def _log_ticks(ax: Axes, values: Sequence[float]) -> None:
    """A log2 axis labelled with the measured values themselves (budgets, concurrency)."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(values)))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(ScalarFormatter(useOffset=False))
    ax.xaxis.set_minor_locator(plt.NullLocator())


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_budgets(rows: Sequence[dict[str, Any]], prompt_set: str, load: str,
                 out: Path) -> Path | None:
    mine = [r for r in rows if r["prompt_set"] == prompt_set and _load(r) == load
            and r["request_tok_s"] is not None]
    lines: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in mine:
        if r["budget"] is not None:
            lines[f"{r['mode']}" + (f" k{r['max_topk']}" if r["max_topk"] else "")].append(r)
    if not lines:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, group in sorted(lines.items()):
        group.sort(key=lambda r: r["budget"])
        _errorbar(ax, [r["budget"] for r in group], [r["request_tok_s"] for r in group], label)
    references = [r for r in mine if r["budget"] is None]
    for i, r in enumerate(references):
        ax.axhline(r["request_tok_s"]["median"], linewidth=1.2, color=f"C{len(lines) + i}",
                   linestyle=REFERENCE_STYLES[i % len(REFERENCE_STYLES)], label=_label(r))
    _log_ticks(ax, [r["budget"] for r in mine if r["budget"] is not None])
    ax.set(xlabel="tree budget (nodes)", ylabel="per-request tok/s (median)",
           title=f"{prompt_set}, {load}: tok/s vs budget")
    ax.legend(fontsize=8)
    return _save(fig, out / f"budget_{prompt_set}_{load}.png")


def plot_concurrency(rows: Sequence[dict[str, Any]], prompt_set: str, out: Path) -> Path | None:
    lines: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if (r["prompt_set"] == prompt_set and r["request_rate"] is None
                and r["output_throughput"] is not None):
            lines[_label(r)].append(r)
    if not lines:
        return None
    fig, (thru, per) = plt.subplots(1, 2, figsize=(11, 4.5))
    for label, group in sorted(lines.items()):
        group.sort(key=lambda r: r["concurrency"])
        xs = [r["concurrency"] for r in group]
        _errorbar(thru, xs, [r["output_throughput"] for r in group], label)
        if all(r["request_tok_s"] is not None for r in group):
            _errorbar(per, xs, [r["request_tok_s"] for r in group], label)
    thru.set(xlabel="concurrency", ylabel="output tokens/s (all requests)", title="throughput")
    per.set(xlabel="concurrency", ylabel="per-request tok/s (median)", title="per request")
    for ax in (thru, per):
        _log_ticks(ax, [r["concurrency"] for group in lines.values() for r in group])
        ax.legend(fontsize=8)
    fig.suptitle(f"{prompt_set}: throughput vs concurrency")
    return _save(fig, out / f"concurrency_{prompt_set}.png")


def plot_acceptance(rows: Sequence[dict[str, Any]], prompt_set: str, out: Path) -> Path | None:
    totals: dict[str, list[int]] = {}
    for r in rows:
        hist = r["acceptance_histogram"]
        if r["prompt_set"] != prompt_set or not hist or r["mode"] == "ar":
            continue
        total = totals.setdefault(_label(r), [])
        total += [0] * (len(hist) - len(total))
        for i, count in enumerate(hist):
            total[i] += count
    if not totals:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(totals)  # grouped bars: one group per committed length
    for i, (label, hist) in enumerate(sorted(totals.items())):
        rounds = max(sum(hist), 1)
        xs = [n + (i - (len(totals) - 1) / 2) * width for n in range(1, len(hist))]
        ax.bar(xs, [c / rounds for c in hist[1:]], width=width, label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="tokens committed per verify round", ylabel="share of rounds",
           title=f"{prompt_set}: acceptance histogram")
    ax.legend(fontsize=8)
    return _save(fig, out / f"acceptance_{prompt_set}.png")


def write_plots(rows: Sequence[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    """Every plot the rows support; returns the files written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path | None] = []
    for prompt_set in dict.fromkeys(r["prompt_set"] for r in rows):
        for load in dict.fromkeys(_load(r) for r in rows if r["prompt_set"] == prompt_set):
            written.append(plot_budgets(rows, prompt_set, load, out))
        written.append(plot_concurrency(rows, prompt_set, out))
        written.append(plot_acceptance(rows, prompt_set, out))
    return [p for p in written if p is not None]
