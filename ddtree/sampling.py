"""The target's sampling distribution: per-request parameters, temperature / top-k / top-p
applied identically to every node's logits, and the seeded per-request generator.

The acceptance rule (ddtree/acceptance.py) is lossless with respect to exactly the
distribution `target_probs` returns, so this file is the definition of "the target's
distribution" for the whole engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree.errors import InvalidArgumentError

_MIN_SEED, _MAX_SEED = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed accepts


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy; top_k 0 = off; top_p 1.0 = off; seed None = random."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def validate(self) -> None:
        """Raises InvalidArgumentError for a value out of range."""
        if not _is_number(self.temperature) or self.temperature < 0:
            raise InvalidArgumentError(
                f"temperature must be a finite number >= 0, got {self.temperature!r}"
            )
        if not _is_integer(self.top_k) or self.top_k < 0:
            raise InvalidArgumentError(
                f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}"
            )
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise InvalidArgumentError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (
            not _is_integer(self.seed) or not _MIN_SEED <= self.seed <= _MAX_SEED
        ):
            raise InvalidArgumentError(f"seed must be None or a 64-bit integer, got {self.seed!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    """A finite int or float (bools and NaN / inf are not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value)


def target_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """logits (B, M, V) -> (B, M, V) float32 probabilities of the target's next token.

    Greedy: one-hot on the argmax. Otherwise: divide by the temperature, keep the top_k
    largest logits, softmax, keep the smallest set of most probable tokens whose mass
    reaches top_p (always at least one), renormalise. Tokens tied with the last one kept
    by top-k or top-p are kept too, so the result never depends on how a sort orders ties.
    """
    if params.is_greedy:
        probs = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
        return probs.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    scaled = logits.float() / params.temperature  # (B, M, V)
    top_index = None
    if 0 < params.top_k < scaled.shape[-1]:
        top_values, top_index = scaled.topk(params.top_k, dim=-1)  # (B, M, k), sorted
        scaled = scaled.masked_fill(scaled < top_values[..., -1:], -math.inf)
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1:
        # With top-k on, the nucleus lies inside the top k: sort k values, not V.
        sorted_probs = (probs.sort(dim=-1, descending=True).values if top_index is None
                        else probs.gather(-1, top_index))
        probs = _top_p(probs, sorted_probs, params.top_p)
    return probs


def _top_p(probs: Tensor, sorted_probs: Tensor, top_p: float) -> Tensor:
    """Keeps the most probable tokens until their mass reaches top_p; renormalises.

    probs: (B, M, V); sorted_probs: (B, M, S) its S largest values, in decreasing order.
    """
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    # mass_before of the top token is 0 < top_p, so at least one token always stays.
    num_kept = (mass_before < top_p).sum(dim=-1, keepdim=True)  # (B, M, 1) >= 1
    cutoff = sorted_probs.gather(-1, num_kept - 1)  # the smallest probability kept
    kept = probs.masked_fill(probs < cutoff, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator:
    """A per-request generator on `device`: seeded, or randomly seeded when seed is None."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
