"""The invariant GEMM with the operation before or after it fused in (one launch instead of
two; a prologue builds the A tile in registers, ddtree/kernels/prologues.py):

- `norm_linear`: RMSNorm with the residual add, then a projection (QKV, gate_up);
- `swiglu_down`: silu(gate) * up of a [gate | up] tensor, then the down projection;
- `linear_norm`: a projection whose output joins the residual stream (o_proj, down), then
  the RMSNorm of the new stream, in the split-K GEMM's reduce kernel (an epilogue: the
  GEMM's main loop is the plain one).

Each equals its two separate kernels bitwise (same rounding steps, the same fixed order
for the norm's sum of squares) and keeps the batch invariance of `invariant_linear`: the
tiling is `linear_config(N, K, dtype)` of the weight (for the down projection K = I, the
weight's width, not x's 2I), never a function of T.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch import Tensor

from ddtree.kernels.matmul import (
    LinearConfig,
    check_operands,
    launch_linear,
    linear_config,
    linear_reference,
    splits_of,
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


def linear_norm(x: Tensor, weight: Tensor, bias: Tensor | None, residual: Tensor,
                norm_weight: Tensor, eps: float, config: LinearConfig | None = None,
                normed_out: Tensor | None = None) -> tuple[Tensor, Tensor] | None:
    """A projection whose output joins the residual stream, with the RMSNorm after it:
    x (T, K), weight (N, K), bias (N,), residual (T, N), norm_weight (N,) in x's dtype ->
    (normed, h) = `rms_norm(invariant_linear(x, weight, bias), norm_weight, eps,
    residual)`, bitwise, the norm in the GEMM's split-K reduce (one launch fewer); None
    where the tiling (`config`, default the weight's for T rows) does not split K.
    `normed_out`: where the normed rows go (T, N) with contiguous rows."""
    config = config or linear_config(weight.shape[0], weight.shape[1], weight.dtype,
                                     x.shape[0])
    if splits_of(config, weight.shape[1]) == 1:
        return None
    check_operands(x, weight, bias, weight.shape[1])
    width = weight.shape[0]
    assert residual.shape == (x.shape[0], width) and residual.stride(1) == 1, residual.shape
    assert residual.dtype == x.dtype and residual.device == x.device, residual.dtype
    assert norm_weight.shape == (width,) and norm_weight.is_contiguous(), norm_weight.shape
    assert norm_weight.dtype == x.dtype and norm_weight.device == x.device, norm_weight.dtype
    h = x.new_empty((x.shape[0], width))
    normed = torch.empty_like(h) if normed_out is None else normed_out
    assert normed.shape == h.shape and normed.stride(1) == 1 and normed.dtype == h.dtype
    launch_linear(x, weight, bias, h, config, eps=eps,
                  norm_after=(residual, norm_weight, normed))
    return normed, h


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


# ------------------------------------------------------------------ the SwiGLU epilogue
# The gate_up GEMM stores silu(gate) * up instead of [gate | up]: each program accumulates
# BLOCK_N gate columns and the BLOCK_N up columns I rows below them in the weight, then
# rounds both as the stored gate_up would be and applies `silu_times` (the elementwise
# steps of swiglu.silu_mul): the same bits as the GEMM then silu_mul, one launch and one
# (T, 2I) round trip through memory fewer per layer. No prologue is involved, so the
# GEMM's main loop is the plain one (the fused prologues' statistics pass measured slower).


def swiglu_epilogue_config(gate_up_weight: Tensor) -> LinearConfig | None:
    """The tiling of the SwiGLU-epilogue GEMM of a (2I, K) [gate | up] weight: that of the
    weight with half its BLOCK_N (each program then reads the weight bytes a program of
    the plain GEMM reads), or None where the weight's tiling splits K (the epilogue needs
    the whole sum). Looked up once per weight shape (eager forwards ask every layer)."""
    two_i, k = gate_up_weight.shape
    return _epilogue_config(two_i, k, gate_up_weight.dtype, None)


def swiglu_epilogue_rows_config(gate_up_weight: Tensor, num_rows: int) -> LinearConfig | None:
    """`swiglu_epilogue_config` with the weight's output tiles for `num_rows` rows
    (matmul.ROW_TILES: the same bits); None where that one is None."""
    two_i, k = gate_up_weight.shape
    return _epilogue_config(two_i, k, gate_up_weight.dtype, num_rows)


@functools.lru_cache(maxsize=256)
def _epilogue_config(two_i: int, k: int, dtype: torch.dtype,
                     num_rows: int | None) -> LinearConfig | None:
    config = linear_config(two_i, k, dtype, num_rows)
    if config.split_k != 1 or two_i % 2:
        return None
    return dataclasses.replace(config, block_n=max(16, config.block_n // 2))


def linear_swiglu_reference(x: Tensor, gate_up_weight: Tensor) -> Tensor:
    """x: (T, K); gate_up_weight: (2I, K) -> silu(gate) * up (T, I): the GEMM in float64
    rounded to x's dtype, then the models' eager SwiGLU."""
    return silu_mul_reference(linear_reference(x, gate_up_weight))


def linear_swiglu(x: Tensor, gate_up_weight: Tensor,
                  config: LinearConfig | None = None) -> Tensor:
    """The Triton kernel: x (T, K) contiguous, gate_up_weight (2I, K) in its dtype ->
    (T, I) = silu_mul(invariant_linear(x, gate_up_weight)) (bitwise, with `config` =
    `swiglu_epilogue_config`, which must not be None)."""
    config = config or swiglu_epilogue_rows_config(gate_up_weight, x.shape[0])
    assert config is not None, "this weight's tiling splits K: use linear then silu_mul"
    check_operands(x, gate_up_weight, None, gate_up_weight.shape[1])
    out = x.new_empty((x.shape[0], gate_up_weight.shape[0] // 2))
    launch_linear(x, gate_up_weight, None, out, config, epilogue=1)
    return out
