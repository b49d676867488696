"""The invariant GEMM with the operation before it fused in as a prologue (one launch
instead of two, the A tile built in registers; ddtree/kernels/prologues.py):

- `norm_linear`: RMSNorm with the residual add, then a projection (QKV, gate_up);
- `swiglu_down`: silu(gate) * up of a [gate | up] tensor, then the down projection.

Each equals its two separate kernels bitwise (same rounding steps, the same fixed order
for the norm's sum of squares) and keeps the batch invariance of `invariant_linear`: the
tiling is `linear_config(N, K, dtype)` of the weight (for the down projection K = I, the
weight's width, not x's 2I), never a function of T.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ddtree.kernels.matmul import (
    LinearConfig,
    check_operands,
    launch_linear,
    linear_config,
    linear_reference,
)
from ddtree.kernels.prologues import NORM, SWIGLU
from ddtree.kernels.rmsnorm import rms_norm_reference
from ddtree.kernels.swiglu import silu_mul_reference


def norm_linear_reference(x: Tensor, residual: Tensor | None, norm_weight: Tensor,
                          eps: float, weight: Tensor,
                          bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """x, residual: (T, H); norm_weight: (H,); weight: (N, H); bias: (N,) or None ->
    (linear(rms_norm(h)) (T, N) with the GEMM in float64, h (T, H)), h = x + residual."""
    normed, h = rms_norm_reference(x, norm_weight, eps, residual)
    return linear_reference(normed, weight, bias), h


def swiglu_down_reference(gate_up: Tensor, weight: Tensor,
                          bias: Tensor | None = None) -> Tensor:
    """gate_up: (T, 2I) = [gate | up]; weight: (N, I) -> linear(silu(gate) * up) (T, N),
    the GEMM in float64."""
    return linear_reference(silu_mul_reference(gate_up), weight, bias)


def norm_linear(x: Tensor, residual: Tensor | None, norm_weight: Tensor, eps: float,
                weight: Tensor, bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The Triton kernel of `norm_linear_reference`: x, residual (T, H) contiguous;
    norm_weight (H,), weight (N, H), bias (N,) in x's dtype -> (out (T, N), h), h = x when
    there is no residual, else a new (T, H) tensor holding x + residual."""
    config = linear_config(weight.shape[0], weight.shape[1], weight.dtype)
    return norm_linear_with_config(x, residual, norm_weight, eps, weight, bias, config)


def norm_linear_with_config(x: Tensor, residual: Tensor | None, norm_weight: Tensor,
                            eps: float, weight: Tensor, bias: Tensor | None,
                            config: LinearConfig) -> tuple[Tensor, Tensor]:
    """`norm_linear` with an explicit tiling (tests)."""
    check_operands(x, weight, bias, weight.shape[1])
    hidden = x.shape[1]
    assert norm_weight.shape == (hidden,) and norm_weight.is_contiguous(), norm_weight.shape
    assert norm_weight.dtype == x.dtype and norm_weight.device == x.device, norm_weight.dtype
    if residual is not None:
        assert residual.shape == x.shape and residual.is_contiguous(), residual.shape
        assert residual.dtype == x.dtype and residual.device == x.device, residual.dtype
    out = x.new_empty((x.shape[0], weight.shape[0]))
    h = x if residual is None else torch.empty_like(x)
    launch_linear(x, weight, bias, out, config, NORM.value, residual, norm_weight,
                  h if residual is not None else None, eps)
    return out, h


def swiglu_down(gate_up: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """The Triton kernel of `swiglu_down_reference`: gate_up (T, 2I) contiguous; weight
    (N, I), bias (N,) in its dtype -> (T, N); the tiling is that of the (N, I) weight."""
    config = linear_config(weight.shape[0], weight.shape[1], weight.dtype)
    return swiglu_down_with_config(gate_up, weight, bias, config)


def swiglu_down_with_config(gate_up: Tensor, weight: Tensor, bias: Tensor | None,
                            config: LinearConfig) -> Tensor:
    """`swiglu_down` with an explicit tiling (tests)."""
    check_operands(gate_up, weight, bias, 2 * weight.shape[1])
    out = gate_up.new_empty((gate_up.shape[0], weight.shape[0]))
    launch_linear(gate_up, weight, bias, out, config, SWIGLU.value)
    return out
