"""Batch-invariant linear layer: `x @ weight.T (+ bias)` whose row t depends only on
x[t], bitwise, whatever the number of rows T.

A GEMM library picks its algorithm (tile shape, split-K) from all three dimensions, so the
same row is summed in a different order when it travels with 0 or 64 other rows; in bf16
that flips greedy tokens on near-ties. The Triton kernel fixes its tiling from the WEIGHT
alone (N, K, dtype) - never from T - and accumulates over K in the same fixed chunks, in
the same order, for every launch.
"""

from __future__ import annotations

import torch
from torch import Tensor


def linear_reference(x: Tensor, weight: Tensor, bias: Tensor | None = None,
                     out_dtype: torch.dtype | None = None) -> Tensor:
    """x: (T, K); weight: (N, K) (nn.Linear layout); bias: (N,) or None -> (T, N) in
    `out_dtype` (default x's dtype), computed in float64 (the tests' ground truth)."""
    out = x.double() @ weight.double().T
    if bias is not None:
        out = out + bias.double()
    return out.to(out_dtype or x.dtype)
