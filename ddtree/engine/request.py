"""What a generation asks for and what a round gives back: the mode table, SpecParams,
GenerationRequest (validated once, where it enters the engine) and RoundResult."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from ddtree.errors import InvalidArgumentError
from ddtree.sampling import SamplingParams
from ddtree.stats import GenerationStats

Mode = Literal["ar", "linear", "tree", "shadow", "auto"]
MODES: tuple[str, ...] = get_args(Mode)
MAX_BUDGET = 1024


@dataclass(frozen=True)
class ModeRule:
    """How a mode drafts and commits. drafts: the row needs a draft block; uses_budget: its
    tree size follows the request's budget; force_chain: its tree holds the block's rank-0
    chain first (in depth order), the rest by score; first_child_only: commit with the
    linear rule on that chain."""

    drafts: bool
    uses_budget: bool
    force_chain: bool
    first_child_only: bool

    def num_nodes(self, budget: int, depth: int) -> int:
        """Tree nodes besides the root for `budget` and draft depth L = block_size - 1."""
        if not self.drafts:
            return 0
        if not self.uses_budget:
            return depth
        return max(budget, depth) if self.force_chain else budget


# ONE table for the modes. `linear` is the forced chain and nothing else; `shadow` builds
# and verifies a tree around the same chain and commits with the same rule, so its tokens
# and acceptance lengths equal linear's and its cost is linear's plus the tree machinery.
MODE_RULES: dict[str, ModeRule] = {
    "ar": ModeRule(drafts=False, uses_budget=False, force_chain=False, first_child_only=False),
    "linear": ModeRule(drafts=True, uses_budget=False, force_chain=True, first_child_only=True),
    "tree": ModeRule(drafts=True, uses_budget=True, force_chain=False, first_child_only=False),
    "shadow": ModeRule(drafts=True, uses_budget=True, force_chain=True, first_child_only=True),
    # The tree size follows measured gain (ddtree/engine/policy.py); a chain is a tree.
    "auto": ModeRule(drafts=True, uses_budget=True, force_chain=False, first_child_only=False),
}


@dataclass(frozen=True)
class SpecParams:
    """How to speculate for one request (server default, overridable per request)."""

    mode: Mode = "tree"
    budget: int = 32
    max_topk: int | None = None

    def validate(self, max_budget: int = MAX_BUDGET) -> None:
        """The budget is held to `max_budget` only by the modes that use it (ar and linear
        ignore it, so a server default larger than a request's limit does not fail them)."""
        if self.mode not in MODES:
            raise InvalidArgumentError(f"mode must be one of {MODES}, got {self.mode!r}")
        limit = max_budget if MODE_RULES[self.mode].uses_budget else MAX_BUDGET
        if not _is_int(self.budget) or not 1 <= self.budget <= limit:
            raise InvalidArgumentError(f"budget must be in [1, {limit}], got {self.budget}")
        if self.max_topk is not None and (not _is_int(self.max_topk) or self.max_topk < 1):
            raise InvalidArgumentError(f"max_topk must be >= 1, got {self.max_topk}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams = SamplingParams()
    spec: SpecParams = SpecParams()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    top_logprobs: int = -1  # -1: no logprobs; 0: the chosen token's; n: n alternatives too
    prompt_logprobs: bool = False  # the target's logprob of each prompt token after the first

    def validate(self, vocab_size: int, max_model_len: int, max_budget: int = MAX_BUDGET) -> None:
        if not self.prompt_ids:
            raise InvalidArgumentError("the prompt is empty")
        bad = [t for t in self.prompt_ids if not 0 <= t < vocab_size]
        if bad:
            raise InvalidArgumentError(f"prompt token ids out of [0, {vocab_size}): {bad[:5]}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise InvalidArgumentError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if len(self.prompt_ids) + self.max_tokens > max_model_len:
            raise InvalidArgumentError(
                f"prompt ({len(self.prompt_ids)} tokens) + max_tokens ({self.max_tokens}) "
                f"exceeds the maximum model length {max_model_len}"
            )
        if not -1 <= self.top_logprobs <= 20:
            raise InvalidArgumentError(f"top_logprobs must be in [0, 20], got {self.top_logprobs}")
        bad_stops = [t for t in self.stop_token_ids if not 0 <= t < vocab_size]
        if bad_stops:
            raise InvalidArgumentError(
                f"stop_token_ids out of [0, {vocab_size}): {bad_stops[:5]}")
        self.sampling.validate()
        self.spec.validate(max_budget)

    def stop_set(self, eos_token_ids: Sequence[int]) -> frozenset[int]:
        stops = set(self.stop_token_ids)
        if not self.ignore_eos:
            stops.update(eos_token_ids)
        return frozenset(stops)


TokenLogprob = tuple[int, float, list[tuple[int, float]]]  # (token, logprob, top alternatives)


@dataclass
class RoundResult:
    """One round of one generation, as streamed to its client."""

    new_tokens: list[int]  # to stream: trimmed at EOS / stop token / max_tokens
    acceptance_length: int  # tokens the round put in the KV (bonus incl.; 0 for prefill)
    finished: bool
    finish_reason: str | None  # "stop" | "length" | None
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None  # the prefill's result only
    num_drafted_nodes: int = 0  # nodes of the verified tree (root excluded)
    committed_tokens: list[int] = field(default_factory=list)  # the path's tokens (in the KV)
    path: list[int] = field(default_factory=list)  # accepted node indices, root first
    stats: GenerationStats | None = None  # the generation's live statistics
