"""The SwiGLU activation of a fused gate_up projection: `silu(gate) * up`, elementwise
(batch invariant by construction), one pass instead of eager's split, silu and multiply."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from ddtree.kernels.launch import launch_kwargs, use_pdl, wait_for_inputs


def silu_mul_reference(gate_up: Tensor) -> Tensor:
    """gate_up: (T, 2I) = [gate | up] -> silu(gate) * up: (T, I) in gate_up's dtype, the
    models' eager operations (silu rounded to the model dtype, then the product)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@triton.jit
def _silu_mul_kernel(gate_up_ptr, out_ptr, inner, stride_in, stride_out, BLOCK: tl.constexpr,
                     USE_PDL: tl.constexpr = False):
    wait_for_inputs(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inner
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * stride_in + inner + cols, mask=mask, other=0.0)
    dtype = up.dtype
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype)  # F.silu: float32 math, one rounding
    out = (silu.to(tl.float32) * up.to(tl.float32)).to(dtype)
    tl.store(out_ptr + row * stride_out + cols, out, mask=mask)


def silu_mul(gate_up: Tensor) -> Tensor:
    """The Triton kernel of `silu_mul_reference`: gate_up (T, 2I) with contiguous rows ->
    (T, I) in its dtype."""
    assert gate_up.dim() == 2 and gate_up.stride(1) == 1, "gate_up must be (T, 2I), rows contiguous"
    assert gate_up.shape[1] % 2 == 0, gate_up.shape
    assert gate_up.dtype in (torch.bfloat16, torch.float16, torch.float32), gate_up.dtype
    num_rows, inner = gate_up.shape[0], gate_up.shape[1] // 2
    out = gate_up.new_empty((num_rows, inner))
    if num_rows == 0:
        return out
    block = min(1024, triton.next_power_of_2(inner))
    pdl = use_pdl(gate_up)
    _silu_mul_kernel[(num_rows, triton.cdiv(inner, block))](
        gate_up, out, inner, gate_up.stride(0), out.stride(0), BLOCK=block, USE_PDL=pdl,
        num_warps=4, **launch_kwargs(pdl),
    )
    return out
