"""Per-request speculation statistics: rounds, acceptance lengths, drafted nodes, stage
times (measured by the engine without a host sync of their own: ddtree/engine/timing.py).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any


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
