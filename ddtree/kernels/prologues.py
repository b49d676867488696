"""What the invariant GEMM (ddtree/kernels/matmul.py) may compute on its A operand before
the dot, tile by tile in registers: RMSNorm with the residual add (the QKV and gate_up
projections) and SwiGLU (the down projection). Each repeats, element for element, the
rounding steps of its standalone kernel (ddtree/kernels/rmsnorm.py, swiglu.py), so a fused
GEMM equals norm-then-GEMM or silu_mul-then-GEMM bitwise and saves one launch each.

The one reduction, the sum of squares behind RMSNorm, is shared with the standalone norm
kernel (`sum_squares`): a reduction's addition order follows the register layout, which
differs between a one-row norm program and a GEMM tile, so both kernels sum in the order
fixed here instead.
"""

from __future__ import annotations

import triton
import triton.language as tl

PLAIN = tl.constexpr(0)  # A is x as stored
NORM = tl.constexpr(1)  # A = rms_norm(x + residual) * norm weight
SWIGLU = tl.constexpr(2)  # x = [gate | up]; A = silu(gate) * up

NORM_CHUNK = tl.constexpr(64)  # columns per step of the sum of squares
NORM_CHUNK_LOG2 = tl.constexpr(6)  # pairwise levels: 2 ** 6 = NORM_CHUNK


@triton.jit
def residual_sum(x_ptrs, r_ptrs, mask, HAS_RESIDUAL: tl.constexpr):
    """h = x + residual rounded to x's dtype (the model's residual stream), or x."""
    x = tl.load(x_ptrs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptrs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def sum_squares(x_ptr, r_ptr, h_ptr, rows, row_mask, store_rows, stride_x, stride_r,
                stride_h, hidden, HAS_RESIDUAL: tl.constexpr, ROWS: tl.constexpr,
                GROUP: tl.constexpr = 1):
    """rows: (ROWS,) -> (ROWS,) float32 sums of h * h over the `hidden` columns of those
    rows, h = `residual_sum`; with a residual, the rows where `store_rows` (ROWS,) holds
    get h written to h_ptr on the way. Order: each of NORM_CHUNK lanes adds its columns
    chunk after chunk, then a pairwise tree adds the lanes. Every addition has two fixed
    operands, so the result does not depend on how a kernel lays the tile out in
    registers.

    GROUP (1 or 16) chunks are loaded per loop step, all before any store or addition: a
    runtime loop's loads are not pipelined, and a store of h between two chunks' loads
    keeps the second from being issued early (h_ptr may alias x), so one chunk per step
    waits a memory latency per 64 columns (64 a row at hidden 4,096: ~25 us a norm on
    the H200, ~28% of an 8B ar step, lease 10; 6 us in groups of 8). The additions keep
    their order either way."""
    cols = tl.arange(0, NORM_CHUNK)
    acc = tl.zeros([ROWS, NORM_CHUNK], tl.float32)
    if GROUP == 1:
        for c0 in range(0, hidden, NORM_CHUNK):
            mask = row_mask[:, None] & ((c0 + cols) < hidden)[None, :]
            offs = c0 + cols[None, :]
            h = residual_sum(x_ptr + rows[:, None] * stride_x + offs,
                             r_ptr + rows[:, None] * stride_r + offs, mask, HAS_RESIDUAL)
            if HAS_RESIDUAL:
                tl.store(h_ptr + rows[:, None] * stride_h + offs, h,
                         mask=mask & store_rows[:, None])
            h32 = h.to(tl.float32)
            acc += h32 * h32
    else:
        tl.static_assert(GROUP == 16, "sum_squares groups 1 or 16 chunks")
        # two (ROWS, lane, 8) tiles: column c0 + (8 * half + chunk) * NORM_CHUNK + lane
        eight = tl.arange(0, 8)
        for c0 in range(0, hidden, NORM_CHUNK * GROUP):
            offs = c0 + eight[None, None, :] * NORM_CHUNK + cols[None, :, None]
            mask = row_mask[:, None, None] & (offs < hidden)
            offs2 = offs + 8 * NORM_CHUNK
            mask2 = row_mask[:, None, None] & (offs2 < hidden)
            x_rows = x_ptr + rows[:, None, None] * stride_x
            r_rows = r_ptr + rows[:, None, None] * stride_r
            h = residual_sum(x_rows + offs, r_rows + offs, mask, HAS_RESIDUAL)
            h2 = residual_sum(x_rows + offs2, r_rows + offs2, mask2, HAS_RESIDUAL)
            if HAS_RESIDUAL:
                h_rows = h_ptr + rows[:, None, None] * stride_h
                tl.store(h_rows + offs, h, mask=mask & store_rows[:, None, None])
                tl.store(h_rows + offs2, h2, mask=mask2 & store_rows[:, None, None])
            acc = _add_squares_of_8(acc, h.to(tl.float32), ROWS)
            acc = _add_squares_of_8(acc, h2.to(tl.float32), ROWS)
    for _ in tl.static_range(NORM_CHUNK_LOG2):  # (ROWS, w) -> (ROWS, w / 2), unrolled
        left, right = tl.split(tl.reshape(acc, [ROWS, acc.shape[1] // 2, 2]))
        acc = left + right
    return tl.reshape(acc, [ROWS])


@triton.jit
def _add_squares_of_8(acc, h32, ROWS: tl.constexpr):
    """acc (ROWS, L) + the squares of h32 (ROWS, L, 8)'s chunks 0, 1, ..., 7 one after
    the other (the splits take the last axis apart: even / odd, twice more)."""
    even, odd = tl.split(tl.reshape(h32, [ROWS, NORM_CHUNK, 4, 2]))  # chunks 0246 / 1357
    c04, c26 = tl.split(tl.reshape(even, [ROWS, NORM_CHUNK, 2, 2]))
    c15, c37 = tl.split(tl.reshape(odd, [ROWS, NORM_CHUNK, 2, 2]))
    c0, c4 = tl.split(c04)
    c2, c6 = tl.split(c26)
    c1, c5 = tl.split(c15)
    c3, c7 = tl.split(c37)
    acc += c0 * c0
    acc += c1 * c1
    acc += c2 * c2
    acc += c3 * c3
    acc += c4 * c4
    acc += c5 * c5
    acc += c6 * c6
    acc += c7 * c7
    return acc


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
def a_tile(x_ptrs, r_ptrs, nw_ptrs, mask, k_mask, rstd, inner,
           PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """One (BLOCK_M, BLOCK_K) A tile at x_ptrs (row-major in x) after the prologue:
    PLAIN: x; NORM: `rms_scale` of `residual_sum` with the rows' rstd (BLOCK_M,) and the
    norm weight at nw_ptrs (BLOCK_K,); SWIGLU: `silu_times` of the gate tile and the up
    tile `inner` columns to its right."""
    if PROLOGUE == NORM:
        h = residual_sum(x_ptrs, r_ptrs, mask, HAS_RESIDUAL)
        weight = tl.load(nw_ptrs, mask=k_mask, other=0.0)
        a = rms_scale(h, rstd[:, None], weight[None, :])
    elif PROLOGUE == SWIGLU:
        gate = tl.load(x_ptrs, mask=mask, other=0.0)
        up = tl.load(x_ptrs + inner, mask=mask, other=0.0)
        a = silu_times(gate, up)
    else:
        a = tl.load(x_ptrs, mask=mask, other=0.0)
    return a

