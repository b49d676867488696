"""What the invariant GEMM (ddtree/kernels/matmul.py) may compute on its A operand before
the dot, tile by tile in registers - RMSNorm (the QKV, gate_up and LM-head projections,
from the row statistics the GEMM before them stored) and SwiGLU (the down projection) -
and the statistics a GEMM's residual epilogue stores for the next norm. Each repeats,
element for element, the rounding steps of its standalone kernel (ddtree/kernels/
rmsnorm.py, swiglu.py), so a fused GEMM equals norm-then-GEMM or silu_mul-then-GEMM
bitwise and saves one launch each.

The one reduction, the sum of squares behind RMSNorm, has one fixed order shared by every
kernel that computes it (a reduction's addition order otherwise follows the register
layout): the canonical pairwise tree over the row's columns padded with zeros to a power
of two. Its first level is `fma(h[2i], h[2i], h[2i+1] * h[2i+1])` (an explicit fma, so no
compiler contraction can pick another operand), every later level adds neighbours. Any
aligned run of STATS_CHUNK columns is a subtree, so a GEMM program holding whole runs can
store their sums (`chunk_square_sums`) and the GEMM after it finish the tree
(`tree_total`) - the same bits as the standalone norm's whole-row tree.
"""

from __future__ import annotations

import triton
import triton.language as tl

PLAIN = tl.constexpr(0)  # A is x as stored
NORM = tl.constexpr(1)  # A = rms_norm(x) * norm weight, x's statistics from a stats tensor
SWIGLU = tl.constexpr(2)  # x = [gate | up]; A = silu(gate) * up

STATS_CHUNK = 32  # columns behind each stored partial sum of squares (a subtree; the
#   kernels below spell it out as 32 and 16 = 32 / 2)


@triton.jit
def residual_sum(x_ptrs, r_ptrs, mask, HAS_RESIDUAL: tl.constexpr):
    """h = x + residual rounded to x's dtype (the model's residual stream), or x."""
    x = tl.load(x_ptrs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptrs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def _pair_sums(x, ROWS: tl.constexpr, GROUPS: tl.constexpr, WIDTH: tl.constexpr):
    """(ROWS, GROUPS, WIDTH) -> (ROWS, GROUPS, WIDTH / 2): neighbours added."""
    left, right = tl.split(tl.reshape(x, [ROWS, GROUPS, WIDTH // 2, 2]))
    return left + right


@triton.jit
def chunk_square_sums(h32, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """h32: (ROWS, WIDTH) float32, WIDTH a multiple of STATS_CHUNK -> (ROWS, WIDTH /
    STATS_CHUNK): each aligned run of STATS_CHUNK columns' sum of squares, in the
    canonical tree's order (its subtree)."""
    groups: tl.constexpr = WIDTH // 32
    even, odd = tl.split(tl.reshape(h32, [ROWS, groups, 16, 2]))
    sums = tl.fma(even, even, odd * odd)  # (ROWS, groups, 16)
    for level in tl.static_range(4):  # 16 -> 8 -> 4 -> 2 -> 1
        sums = _pair_sums(sums, ROWS, groups, 16 >> level)
    return tl.reshape(sums, [ROWS, groups])


@triton.jit
def tree_total(partials, ROWS: tl.constexpr, WIDTH: tl.constexpr, LOG2: tl.constexpr):
    """partials: (ROWS, WIDTH) float32, WIDTH = 2 ** LOG2 -> (ROWS,) by the canonical
    tree's upper levels (neighbours added, level after level)."""
    sums = tl.reshape(partials, [ROWS, 1, WIDTH])
    for level in tl.static_range(LOG2):
        sums = _pair_sums(sums, ROWS, 1, WIDTH >> level)
    return tl.reshape(sums, [ROWS])


@triton.jit
def inverse_rms(sum_sq, hidden, eps):
    """The float32 1 / rms of rows with sum of squares `sum_sq` over `hidden` columns."""
    return tl.rsqrt(sum_sq / hidden + eps)


@triton.jit
def rms_scale(h, rstd, weight):
    """h: (.., W) in the model dtype; rstd broadcast to it; weight: (W,) -> weight *
    (h * rstd), normalised in float32, rounded, scaled, rounded (as eager RMSNorm)."""
    normed = (h.to(tl.float32) * rstd).to(h.dtype).to(tl.float32)
    return (weight.to(tl.float32) * normed).to(h.dtype)


@triton.jit
def silu_times(gate, up):
    """silu(gate) * up of two tiles in the model dtype: silu in float32 rounded once (as
    F.silu), then the product rounded once."""
    g32 = gate.to(tl.float32)
    silu = (g32 / (1.0 + tl.exp(-g32))).to(up.dtype)
    return (silu.to(tl.float32) * up.to(tl.float32)).to(up.dtype)


@triton.jit
def a_tile(x_ptrs, nw_ptrs, mask, k_mask, rstd, inner, PROLOGUE: tl.constexpr):
    """One (BLOCK_M, BLOCK_K) A tile at x_ptrs (row-major in x) after the prologue:
    PLAIN: x; NORM: `rms_scale` of x with the rows' rstd (BLOCK_M,) and the norm weight
    at nw_ptrs (BLOCK_K,); SWIGLU: `silu_times` of the gate tile and the up tile `inner`
    columns to its right."""
    if PROLOGUE == NORM:
        h = tl.load(x_ptrs, mask=mask, other=0.0)
        weight = tl.load(nw_ptrs, mask=k_mask, other=0.0)
        a = rms_scale(h, rstd[:, None], weight[None, :])
    elif PROLOGUE == SWIGLU:
        gate = tl.load(x_ptrs, mask=mask, other=0.0)
        up = tl.load(x_ptrs + inner, mask=mask, other=0.0)
        a = silu_times(gate, up)
    else:
        a = tl.load(x_ptrs, mask=mask, other=0.0)
    return a

