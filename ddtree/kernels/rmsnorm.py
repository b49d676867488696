"""RMSNorm with an optional fused residual add, one row at a time (batch invariant by
construction: each row is reduced alone, in one fixed order)."""

from __future__ import annotations

import torch
from torch import Tensor


def rms_norm_reference(x: Tensor, weight: Tensor, eps: float,
                       residual: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """x, residual: (T, H); weight: (H,). With a residual, h = x + residual (rounded to x's
    dtype, as the model's residual stream is) is normalised; without one, h = x.
    Returns (weight * (h / rms(h)) in x's dtype with the statistics in float32, h).
    Same operations as the models' RMSNorm: normalise in float32, cast, then scale."""
    h = x if residual is None else x + residual
    h32 = h.float()
    normed = h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(h.dtype), h
