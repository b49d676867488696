"""RMSNorm with an optional fused residual add, one row at a time (batch invariant by
construction: each row is reduced alone, in one fixed order)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree.kernels.launch import launch_kwargs, use_pdl, wait_for_inputs
from ddtree.kernels.prologues import inverse_rms, residual_sum, rms_scale, sum_squares


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


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, h_ptr, hidden, eps,
    stride_x, stride_r, stride_o, stride_h,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr = False,
):
    wait_for_inputs(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    # The statistics in the fixed order the GEMM's norm prologue uses (prologues.py),
    # storing h on the way; then the whole row again for the output.
    one = tl.full([1], True, tl.int1)
    sum_sq = sum_squares(x_ptr, residual_ptr, h_ptr, row + tl.arange(0, 1), one, one,
                         stride_x, stride_r, stride_h, hidden, HAS_RESIDUAL, 1, 16)
    rstd = inverse_rms(sum_sq, hidden, eps)  # (1,)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    h = residual_sum(x_ptr + row * stride_x + cols, residual_ptr + row * stride_r + cols,
                     mask, HAS_RESIDUAL)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride_o + cols, rms_scale(h, rstd, weight), mask=mask)


def rms_norm(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None,
             out: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The Triton kernel of `rms_norm_reference`: x, residual (T, H) with contiguous rows;
    weight (H,) in x's dtype. One program per row. Returns (normed (T, H), h), h = x when
    there is no residual, else a new (T, H) tensor holding x + residual; `out`: where the
    normed rows go (T, H) with contiguous rows (a view into a larger buffer)."""
    assert x.dim() == 2 and x.stride(1) == 1, "x must be (T, H) with contiguous rows"
    assert x.dtype in (torch.bfloat16, torch.float16, torch.float32), x.dtype
    num_rows, hidden = x.shape
    assert weight.shape == (hidden,) and weight.is_contiguous(), weight.shape
    assert weight.dtype == x.dtype and weight.device == x.device, weight.dtype
    if residual is not None:
        assert residual.shape == x.shape and residual.stride(1) == 1, residual.shape
        assert residual.dtype == x.dtype and residual.device == x.device, residual.dtype
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    assert out.shape == x.shape and out.stride(1) == 1 and out.dtype == x.dtype, out.shape
    h = x if residual is None else torch.empty_like(x, memory_format=torch.contiguous_format)
    if num_rows == 0:
        return out, h
    block = triton.next_power_of_2(hidden)
    source = residual if residual is not None else x
    pdl = use_pdl(x)
    _rms_norm_kernel[(num_rows,)](
        x, source, weight, out, h, hidden, eps,
        x.stride(0), source.stride(0), out.stride(0), h.stride(0),
        HAS_RESIDUAL=residual is not None, BLOCK=block, USE_PDL=pdl,
        num_warps=min(16, max(1, block // 512)), **launch_kwargs(pdl),
    )
    return out, h
