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


# ---------------------------------------------------------------------------- batches


@dataclass(frozen=True, eq=False)
class RowSampling:
    """Per-row sampling parameters of a batch, on the device: temperature (B,) float32 (0 =
    greedy), top_k (B,) int64 (0 = off), top_p (B,) float32 (1 = off), seed (B,) int64.
    `any_sampled` / `any_filtered` are host flags fixed per compiled variant: whether any
    row samples, and whether any row uses top-k / top-p (a full sort of each row)."""

    temperature: Tensor
    top_k: Tensor
    top_p: Tensor
    seed: Tensor
    any_sampled: bool
    any_filtered: bool

    @property
    def is_greedy(self) -> Tensor:
        return self.temperature == 0

    @classmethod
    def of(cls, params: SamplingParams, batch: int, device: torch.device | str,
           seed: Tensor | None = None) -> RowSampling:
        """The same parameters for `batch` rows (seed: (B,) int64, default all 0)."""
        filtered = params.top_k > 0 or params.top_p < 1
        return cls(
            temperature=torch.full((batch,), float(params.temperature), device=device),
            top_k=torch.full((batch,), params.top_k, dtype=torch.long, device=device),
            top_p=torch.full((batch,), float(params.top_p), device=device),
            seed=seed if seed is not None else torch.zeros(batch, dtype=torch.long,
                                                           device=device),
            any_sampled=not params.is_greedy, any_filtered=filtered and not params.is_greedy)


def target_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """logits (B, M, V) -> (B, M, V) float32 probabilities of the target's next token.

    Greedy: one-hot on the argmax. Otherwise: divide by the temperature, keep the top_k
    largest logits, softmax, keep the smallest set of most probable tokens whose mass
    reaches top_p (always at least one), renormalise. Tokens tied with the last one kept
    by top-k or top-p are kept too, so the result never depends on how a sort orders ties.
    The engine computes it per row (`row_target_probs`); this is the same function with
    one set of parameters for every row.
    """
    return row_target_probs(logits, RowSampling.of(params, logits.shape[0], logits.device))


def row_target_probs(logits: Tensor, rows: RowSampling) -> Tensor:
    """logits (B, M, V) -> (B, M, V) float32: `target_probs` with each row's own
    parameters (greedy rows get a one-hot on the argmax)."""
    greedy = rows.is_greedy[:, None, None]
    one_hot = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
    one_hot.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    if not rows.any_sampled:
        return one_hot
    temperature = torch.where(rows.is_greedy, 1.0, rows.temperature)
    scaled = logits.float() / temperature[:, None, None]  # (B, M, V)
    if rows.any_filtered:
        probs = _filtered_probs(scaled, rows)
    else:
        probs = torch.softmax(scaled, dim=-1)
    return torch.where(greedy, one_hot, probs)


def _filtered_probs(scaled: Tensor, rows: RowSampling) -> Tensor:
    """Top-k then top-p per row on scaled logits (B, M, V), one sort of the vocabulary."""
    vocab = scaled.shape[-1]
    values, order = scaled.sort(dim=-1, descending=True)  # (B, M, V)
    k = torch.where((rows.top_k > 0) & (rows.top_k < vocab), rows.top_k, vocab)  # (B,)
    kth = values.gather(-1, (k - 1)[:, None, None].expand(*values.shape[:2], 1))
    scaled = scaled.masked_fill(scaled < kth, -math.inf)
    probs = torch.softmax(scaled, dim=-1)
    sorted_probs = probs.gather(-1, order)  # (B, M, V) decreasing
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    top_p = rows.top_p[:, None, None]
    num_kept = (mass_before < top_p).sum(dim=-1, keepdim=True).clamp(min=1)  # (B, M, 1)
    cutoff = sorted_probs.gather(-1, num_kept - 1)
    kept = probs.masked_fill(probs < cutoff, 0.0)
    nucleus = kept / kept.sum(dim=-1, keepdim=True)
    return torch.where(top_p < 1, nucleus, probs)


# ---------------------------------------------------------------------------- randomness
# Counter-based: a draw is a hash of (request seed, committed length, stream, index), so a
# request's random numbers never depend on which other requests share its batch, and no
# generator state has to live in (or be captured by) a CUDA graph.

_MASK32 = 0xFFFFFFFF
STREAM_ACCEPT, STREAM_BONUS, STREAM_FIRST = 0, 1, 2


def _mul32(x: Tensor, constant: int) -> Tensor:
    """(x * constant) mod 2^32 for x in [0, 2^32) without int64 overflow."""
    low = x * (constant & 0xFFFF)
    high = ((x * (constant >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK32


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit integer finaliser (xor-shift-multiply, full avalanche)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def counter_uniform(seed: Tensor, counter: Tensor, stream: int, size: int) -> Tensor:
    """(B, size) float32 uniforms in (0, 1) from seed, counter: (B,) int64."""
    h = _mix32(seed & _MASK32)
    h = _mix32(h ^ ((seed >> 32) & _MASK32))
    h = _mix32(h ^ (counter & _MASK32))
    h = _mix32(h ^ stream)  # (B,)
    index = torch.arange(size, device=seed.device)
    bits = _mix32(h[:, None] ^ index[None, :]) >> 8  # (B, size), 24 random bits
    return (bits.float() + 0.5) * (1.0 / (1 << 24))


def seed_to_int64(seed: int) -> int:
    """Any accepted seed (-2^63 .. 2^64-1) as the int64 with the same low 64 bits."""
    seed %= 1 << 64
    return seed - (1 << 64) if seed >= 1 << 63 else seed
