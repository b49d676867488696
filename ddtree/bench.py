"""In-process benchmark: every mode side by side on the same prompts, in one run.

Reports per (prompt set, mode, budget): acceptance length (tokens per round, bonus
included), decode tokens/s, time to first token, and wall time, after warm-up.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ddtree.engine import GenerationRequest, SpecParams, generate
from ddtree.models.drafter import DFlashDrafter
from ddtree.models.target import TargetModel
from ddtree.sampling import SamplingParams


@dataclass
class BenchRow:
    prompt_set: str
    mode: str
    budget: int
    temperature: float
    num_prompts: int = 0
    num_rounds: int = 0
    num_tokens: int = 0
    decode_seconds: float = 0.0
    ttft_seconds: list[float] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)
    matches_ar: bool | None = None  # at T=0: same tokens as the ar row of this prompt set

    @property
    def acceptance_length(self) -> float:
        return self.num_tokens / max(self.num_rounds, 1)

    @property
    def tokens_per_second(self) -> float:
        return self.num_tokens / max(self.decode_seconds, 1e-9)

    def to_dict(self) -> dict[str, object]:
        ttft = sorted(self.ttft_seconds)
        return {
            "prompt_set": self.prompt_set, "mode": self.mode, "budget": self.budget,
            "temperature": self.temperature, "num_prompts": self.num_prompts,
            "num_rounds": self.num_rounds, "num_decode_tokens": self.num_tokens,
            "acceptance_length": round(self.acceptance_length, 3),
            "decode_tokens_per_second": round(self.tokens_per_second, 2),
            "median_ttft_seconds": round(ttft[len(ttft) // 2], 5) if ttft else None,
            "matches_ar": self.matches_ar,
        }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_one(target: TargetModel, drafter: DFlashDrafter | None, request: GenerationRequest,
            row: BenchRow) -> None:
    """One generation; decode time excludes prefill (TTFT is reported apart)."""
    device = target.embeddings.embed_tokens.weight.device
    _sync(device)
    start = time.perf_counter()
    tokens: list[int] = []
    first_done = start
    rounds = generate(target, drafter, request)
    for index, (result, _stats) in enumerate(rounds):
        if index == 0:
            first_done = time.perf_counter()
            row.ttft_seconds.append(first_done - start)
        else:
            row.num_rounds += 1
            row.num_tokens += result.acceptance_length
        tokens.extend(result.new_tokens)
    _sync(device)
    row.decode_seconds += time.perf_counter() - first_done
    row.num_prompts += 1
    row.token_ids.append(tokens)


def bench(
    target: TargetModel, drafter: DFlashDrafter | None, prompt_sets: dict[str, list[list[int]]],
    specs: Sequence[SpecParams], sampling: SamplingParams, max_tokens: int, warmup: int = 1,
) -> list[BenchRow]:
    """Runs every spec over every prompt set; `warmup` untimed generations per spec first."""
    rows = []
    for name, prompts in prompt_sets.items():
        for spec in specs:
            row = BenchRow(name, spec.mode, spec.budget, sampling.temperature)
            for prompt_ids in prompts[:warmup]:
                scratch = BenchRow(name, spec.mode, spec.budget, sampling.temperature)
                run_one(target, drafter, GenerationRequest(prompt_ids, max_tokens, sampling, spec),
                        scratch)
            for i, prompt_ids in enumerate(prompts):
                seeded = SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p,
                                        None if sampling.seed is None else sampling.seed + i)
                run_one(target, drafter, GenerationRequest(prompt_ids, max_tokens, seeded, spec),
                        row)
            rows.append(row)
    mark_matches_ar(rows)
    return rows


def mark_matches_ar(rows: Sequence[BenchRow]) -> None:
    """At temperature 0 every mode must serve the ar tokens: record whether it did."""
    reference = {r.prompt_set: r.token_ids for r in rows if r.mode == "ar" and r.temperature == 0}
    for row in rows:
        if row.temperature == 0 and row.prompt_set in reference:
            row.matches_ar = row.token_ids == reference[row.prompt_set]


def format_table(rows: Sequence[BenchRow]) -> str:
    header = (f"{'set':<12}{'mode':<8}{'budget':>7}{'T':>5}{'tau':>8}{'tok/s':>10}"
              f"{'ttft ms':>9}{'=ar':>5}")
    lines = [header, "-" * len(header)]
    for row in rows:
        d = row.to_dict()
        ttft = d["median_ttft_seconds"]
        ttft_ms = f"{float(ttft) * 1000:.1f}" if ttft is not None else "-"  # type: ignore[arg-type]
        lines.append(
            f"{row.prompt_set:<12}{row.mode:<8}{row.budget:>7}{row.temperature:>5.1f}"
            f"{row.acceptance_length:>8.2f}{row.tokens_per_second:>10.1f}{ttft_ms:>9}"
            f"{'-' if row.matches_ar is None else 'yes' if row.matches_ar else 'NO':>5}"
        )
    return "\n".join(lines)
