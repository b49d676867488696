"""The host's side of one generation in the engine: its pool slot, what it asked for, its
statistics, and the rule that turns committed tokens into what is streamed (trimmed at the
first stop token, excluded, or at max_tokens)."""

from __future__ import annotations

from dataclasses import dataclass

from ddtree.engine.request import GenerationRequest, RoundResult, TokenLogprob
from ddtree.stats import GenerationStats


@dataclass
class Row:
    """A generation holding pool slot `slot` (set once admitted)."""

    request_id: str
    request: GenerationRequest
    num_nodes: int  # tree nodes per round besides the root (0 = ar)
    stops: frozenset[int]
    seed: int
    stats: GenerationStats
    slot: int = -1
    committed_len: int = 0
    bonus_token: int = -1  # the root of the row's next tree (chosen, not yet in the KV)
    num_pending: int = 0  # rows committed by the last round (the drafter's next context)
    finished: bool = False
    drafting: bool = False  # the drafter holds this row's context
    auto: bool = False  # the tree size follows the budget policy
    force_chain: bool = False  # its tree holds the block's rank-0 chain (mode rule; auto's chain)
    last_used_s: float = 0.0  # client sessions: for the idle timeout
    group: int = 0  # with a remote drafter: which of the two alternating groups (Engine.step)
    root_only: bool = False  # this round verifies its root alone (its drafter session opens)

    @property
    def follows_policy(self) -> bool:
        """An auto row that still drafts (one whose drafter went away continues in ar)."""
        return self.auto and self.drafting

    @property
    def wants_logprobs(self) -> bool:
        return self.request.top_logprobs >= 0

    def emit(self, tokens: list[int], accepted: int,
             logprobs: list[TokenLogprob] | None) -> RoundResult:
        """Trims at the first stop token (excluded from the output) or at max_tokens,
        whichever comes first: a stop token past max_tokens is one ar would never have
        generated (a round may commit beyond the budget; ar stops at its length)."""
        reason = None
        room = self.request.max_tokens - self.stats.num_completion_tokens
        for i, token in enumerate(tokens[:room]):
            if token in self.stops:
                tokens, reason = tokens[:i], "stop"
                break
        if reason is None and len(tokens) >= room:
            tokens, reason = tokens[:room], "length"
        self.stats.num_completion_tokens += len(tokens)
        self.finished = reason is not None
        if logprobs is not None:
            logprobs = logprobs[: len(tokens)]
        return RoundResult(tokens, accepted, self.finished, reason, logprobs, stats=self.stats)
