"""One report row: a (prompt set, target, spec, load point) measured over its repeats, and
the `=ar` check (at T=0 every mode must serve exactly the ar row's output)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ddtree.benchmark.config import LoadPoint, RequestSettings, SpecPoint
from ddtree.benchmark.load import RunResult
from ddtree.benchmark.metrics import (
    acceptance_length,
    latency_ms,
    percentiles,
    spread,
    summarize_run,
    summed_histogram,
)
from ddtree.benchmark.sample import RequestSample

MAIN_TARGETS = ("inprocess", "url")


@dataclass
class BenchRow:
    prompt_set: str
    target: str  # inprocess | url | hf | baseline-url
    spec: SpecPoint
    load: LoadPoint
    settings: RequestSettings
    runs: list[RunResult] = field(default_factory=list)
    matches_ar: bool | None = None

    @property
    def samples(self) -> list[RequestSample]:
        return [s for run in self.runs for s in run.samples]

    def key(self) -> tuple[Any, ...]:
        """What identifies this row across two reports (`ddtree bench compare`)."""
        return (self.prompt_set, self.target, self.spec.mode, self.spec.budget,
                self.spec.max_topk, self.load.concurrency, self.load.request_rate,
                self.settings.temperature)

    def summary(self) -> dict[str, Any]:
        samples = self.samples
        ok = [s for s in samples if s.is_ok]
        runs = [summarize_run(run) for run in self.runs]
        histogram = summed_histogram(ok)
        served = next((s for s in ok if s.served_mode is not None), None)
        return {
            "prompt_set": self.prompt_set, "target": self.target, "mode": self.spec.mode,
            "budget": self.spec.budget, "max_topk": self.spec.max_topk,
            "served_mode": served.served_mode if served else None,
            "served_budget": served.served_budget if served else None,
            "temperature": self.settings.temperature, "max_tokens": self.settings.max_tokens,
            "concurrency": self.load.concurrency, "request_rate": _rate(self.load.request_rate),
            "num_repeats": len(self.runs), "num_requests": len(samples),
            "num_failed": len(samples) - len(ok),
            "prompt_tokens": sum(s.prompt_tokens or 0 for s in ok),
            "completion_tokens": sum(s.completion_tokens for s in ok),
            "acceptance_length": acceptance_length(histogram),
            "acceptance_histogram": histogram,
            "request_tok_s": spread([r["request_tok_s"] for r in runs]),
            "output_throughput": spread([r["output_throughput"] for r in runs]),
            "request_throughput": spread([r["request_throughput"] for r in runs]),
            "wall_s": spread([r["wall_s"] for r in runs]),
            "latency_ms": latency_ms(ok),
            "per_request_tok_s": percentiles(
                [t for s in ok if s.has_output and (t := s.tokens_per_second) is not None]),
            "per_request_e2e_tok_s": percentiles(
                [t for s in ok if s.has_output and (t := s.e2e_tokens_per_second) is not None]),
            "matches_ar": self.matches_ar,
            "runs": runs,
        }

    def to_dict(self) -> dict[str, Any]:
        samples = [s.to_dict(run.start) for run in self.runs for s in run.samples]
        return self.summary() | {"samples": samples}


def _rate(rate: float | None) -> float | str | None:
    """JSON has no infinity: an unthrottled open loop is the string "inf"."""
    return "inf" if rate is not None and rate == float("inf") else rate


def mark_matches_ar(rows: Sequence[BenchRow]) -> None:
    """At T=0, per prompt set: every row's outputs against the main target's ar outputs of
    the same prompts (token ids where both sides have them, else text)."""
    reference: dict[str, dict[int, dict[str, Any]]] = {}
    for row in rows:
        if row.spec.mode == "ar" and row.target in MAIN_TARGETS and row.settings.temperature == 0:
            per_prompt = reference.setdefault(row.prompt_set, {})
            for sample in row.samples:
                if sample.is_ok:
                    kind, value = sample.output_key()
                    per_prompt.setdefault(sample.prompt_index, {}).setdefault(kind, value)
                    per_prompt[sample.prompt_index].setdefault("text", sample.text)
    for row in rows:
        ref = reference.get(row.prompt_set)
        if row.settings.temperature != 0 or not ref:
            continue
        checked = [(s, ref[s.prompt_index]) for s in row.samples
                   if s.is_ok and s.prompt_index in ref]
        if checked:
            row.matches_ar = all(_same_output(s, r) for s, r in checked)


def _same_output(sample: RequestSample, reference: dict[str, Any]) -> bool:
    kind, value = sample.output_key()
    if kind in reference:
        return bool(reference[kind] == value)
    return sample.text == reference["text"]
