"""Per-request speculation statistics and stage timing that adds no host sync.

Stage times on a GPU are recorded with CUDA events and only read when the round has
already synchronised (to learn its committed tokens), so collecting them costs nothing
extra on the decode path; on the CPU they are plain wall-clock intervals.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class GenerationStats:
    """What rides on every response: rounds, acceptance lengths, drafted nodes, stage times."""

    mode: str
    budget: int
    num_rounds: int = 0
    acceptance_lengths: list[int] = field(default_factory=list)
    num_drafted_nodes: int = 0
    num_accepted_draft_tokens: int = 0
    num_prompt_tokens: int = 0
    num_completion_tokens: int = 0
    stage_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def record_round(self, acceptance_length: int, num_nodes: int) -> None:
        self.num_rounds += 1
        self.acceptance_lengths.append(acceptance_length)
        self.num_drafted_nodes += num_nodes
        self.num_accepted_draft_tokens += acceptance_length - 1

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens committed per verify round, bonus included (tau)."""
        if not self.acceptance_lengths:
            return 0.0
        return sum(self.acceptance_lengths) / len(self.acceptance_lengths)

    def acceptance_histogram(self) -> list[int]:
        """Index i = number of rounds that committed i tokens."""
        hist = [0] * (max(self.acceptance_lengths, default=0) + 1)
        for length in self.acceptance_lengths:
            hist[length] += 1
        return hist

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "budget": self.budget,
            "num_rounds": self.num_rounds,
            "mean_acceptance_length": round(self.mean_acceptance_length, 4),
            "acceptance_histogram": self.acceptance_histogram(),
            "num_drafted_nodes": self.num_drafted_nodes,
            "num_accepted_draft_tokens": self.num_accepted_draft_tokens,
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_completion_tokens": self.num_completion_tokens,
            "stage_seconds": {k: round(v, 6) for k, v in self.stage_seconds.items()},
        }


class StageTimer:
    """Marks stage boundaries; `flush` adds finished intervals to `stats.stage_seconds`.

    On a GPU each boundary is a CUDA event. `flush` never waits: it resolves the
    intervals whose end event has already completed and keeps the rest for a later
    flush; `close` waits for the last ones once the generation is over.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._last: Any = None
        self._pending: list[tuple[str, Any, Any]] = []  # (stage, begin, end)

    def _now(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def start(self) -> None:
        self._last = self._now()

    def mark(self, stage: str) -> None:
        """Ends `stage` (which began at the previous mark or `start`)."""
        now = self._now()
        self._pending.append((stage, self._last, now))
        self._last = now

    def flush(self, stats: GenerationStats) -> None:
        while self._pending:
            stage, begin, end = self._pending[0]
            if self.cuda:
                if not end.query():  # still running: resolve at a later flush
                    return
                seconds = begin.elapsed_time(end) / 1000.0
            else:
                seconds = end - begin
            stats.stage_seconds[stage] += seconds
            self._pending.pop(0)

    def close(self, stats: GenerationStats) -> None:
        """Waits for the last recorded interval (call once the generation is over)."""
        if self.cuda and self._pending:
            self._pending[-1][2].synchronize()
        self.flush(stats)
