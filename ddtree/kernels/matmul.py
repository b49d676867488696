"""Batch-invariant linear layer: `x @ weight.T (+ bias)` whose row t depends only on
x[t], bitwise, whatever the number of rows T.

A GEMM library picks its algorithm (tile shape, split-K) from all three dimensions, so the
same row is summed in a different order when it travels with 0 or 64 other rows; in bf16
that flips greedy tokens on near-ties. The Triton kernel fixes its tiling from the WEIGHT
alone (N, K, dtype) - never from T - and accumulates over K in the same fixed chunks, in
the same order, for every launch.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree.kernels.launch import (
    launch_kwargs,
    prefetch_blocks,
    prefetch_enabled,
    prefetch_l2,
    use_pdl,
    wait_for_inputs,
)
from ddtree.kernels.prologues import (
    NORM,
    SWIGLU,
    a_tile,
    inverse_rms,
    rms_scale,
    silu_times,
    sum_squares,
)

# The operation after the dot (`_linear_kernel`'s EPILOGUE): none, or SwiGLU of a
# [gate | up] weight - each program accumulates a gate tile and the up tile N rows below
# it and stores silu(gate) * up, N columns wide (fused_linear.linear_swiglu).
EPILOGUE_NONE = tl.constexpr(0)
EPILOGUE_SWIGLU = tl.constexpr(1)
# Shared memory a block may ask on the H200 (sm_90: 227 KB)
SHARED_BYTES = 232_448


def linear_reference(x: Tensor, weight: Tensor, bias: Tensor | None = None,
                     out_dtype: torch.dtype | None = None) -> Tensor:
    """x: (T, K); weight: (N, K) (nn.Linear layout); bias: (N,) or None -> (T, N) in
    `out_dtype` (default x's dtype), computed in float64 (the tests' ground truth)."""
    out = x.double() @ weight.double().T
    if bias is not None:
        out = out + bias.double()
    return out.to(out_dtype or x.dtype)


@dataclass(frozen=True)
class LinearConfig:
    """One tiling. `split_k` > 1 cuts K into that many ranges of whole BLOCK_K blocks whose
    float32 partial sums a second kernel adds in split order (no atomics)."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int


SM_TARGET = 128  # programs wanted at T <= BLOCK_M (the H200 has 132 SMs)
MIN_SPLIT_BYTES = 8 << 20  # below this a weight reads in ~2 us: a second launch costs more
MIN_BLOCKS_PER_SPLIT = 8  # K blocks each split keeps, so the pipeline stays full


# Tilings measured best on the H200 for the shapes the project serves (scripts/gpu/
# tune_linear.py wrote it; the key is "NxK:dtype"). Like the rule below, a function of the
# weight alone, so a row's arithmetic never depends on T.
TUNED_PATH = Path(__file__).with_name("linear_tuned.json")
TUNED: dict[str, dict[str, int]] = (
    json.loads(TUNED_PATH.read_text()) if TUNED_PATH.exists() else {})


# M x N tiles by the number of rows, for the shapes the project serves: per weight key,
# [min_rows, block_m, block_n, num_warps] entries (the last whose min_rows <= T applies).
# Only the output tiles and warps change, never BLOCK_K, split-K or the stages, so each
# output element is summed over K in the same chunks and order: on the H200 every such
# candidate gave the weight tiling's bits at T = 1 / 33 / 132 / 264 (scripts/gpu/
# gemm_rows_sweep.py, lease 12, all bitwise), and at 132+ rows (batches of trees) wider
# tiles are up to 30% faster; at the static prefill's 1024 / 2048-token buckets (lease 20,
# every candidate bitwise at 128-2048 rows) 128-row tiles take 15-17% off a layer's GEMMs.
# Applied to the plain GEMM and the SwiGLU epilogue (which halves the plain BLOCK_N), not
# to the fused prologues (not measured). DDTREE_ROW_TILES=0 leaves them out (A/B on the GPU).
ROW_TILES_PATH = Path(__file__).with_name("linear_rows.json")
ROW_TILES: dict[str, list[list[int]]] = (
    json.loads(ROW_TILES_PATH.read_text())
    if ROW_TILES_PATH.exists() and os.environ.get("DDTREE_ROW_TILES", "1") != "0" else {})


def tuned_key(out_features: int, in_features: int, dtype: torch.dtype) -> str:
    return f"{out_features}x{in_features}:{str(dtype).removeprefix('torch.')}"


def rows_config(config: LinearConfig, out_features: int, in_features: int,
                dtype: torch.dtype, num_rows: int) -> LinearConfig:
    """`config` (the weight's tiling) with the output tiles and warps of `ROW_TILES` for
    `num_rows` rows; the K order is untouched, so no element's bits change."""
    chosen = None
    for min_rows, block_m, block_n, warps in ROW_TILES.get(
            tuned_key(out_features, in_features, dtype), ()):
        if num_rows >= min_rows:
            chosen = dataclasses.replace(config, block_m=block_m, block_n=block_n,
                                         num_warps=warps)
    return chosen or config


def linear_config(out_features: int, in_features: int, dtype: torch.dtype,
                  num_rows: int | None = None) -> LinearConfig:
    """The tiling of a (N, K) weight: its K order a function of the weight alone, never
    of T; with `num_rows`, the output tiles of `ROW_TILES` for that many rows.

    16-bit weights: 64 x 128 tiles (one warpgroup's wgmma on Hopper, and memory bound at
    T <= 64: 64 rows of MMA per weight byte is under the H200's ~180 FLOP/byte ridge);
    float32 weights: a small FMA tile (ieee dot). Split-K when the N tiles alone would
    leave most SMs idle at small T and the weight is large enough to be worth a launch.
    A shape in the tuned table takes its measured tiling instead."""
    tuned = TUNED.get(tuned_key(out_features, in_features, dtype))
    config = (LinearConfig(**tuned) if tuned is not None
              else default_linear_config(out_features, in_features, dtype))
    if num_rows is None:
        return config
    return rows_config(config, out_features, in_features, dtype, num_rows)


def default_linear_config(out_features: int, in_features: int,
                          dtype: torch.dtype) -> LinearConfig:
    """The rule for shapes the table does not hold (see `linear_config`)."""
    if dtype == torch.float32:
        block_m, block_n, block_k, warps, stages = 32, 64, 32, 4, 3
    else:
        block_m, block_n, block_k, warps, stages = 64, 128, 64, 4, 4
    n_tiles = triton.cdiv(out_features, block_n)
    k_blocks = triton.cdiv(in_features, block_k)
    weight_bytes = out_features * in_features * torch.finfo(dtype).bits // 8
    split_k = 1
    while (weight_bytes >= MIN_SPLIT_BYTES and n_tiles * split_k < SM_TARGET
           and k_blocks // (2 * split_k) >= MIN_BLOCKS_PER_SPLIT):
        split_k *= 2
    return LinearConfig(block_m, block_n, block_k, split_k, warps, stages)


@triton.jit(do_not_specialize=["num_rows", "num_prefetch"])
def _linear_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, part_ptr, r_ptr, nw_ptr, h_ptr, num_rows, N, K,
    blocks_per_split, num_prefetch, eps, stride_xm, stride_rm, stride_hm, stride_wn, stride_om,
    PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_IEEE: tl.constexpr, EPILOGUE: tl.constexpr = 0, USE_PDL: tl.constexpr = False,
    PREFETCH_LINES: tl.constexpr = 0,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_mask = rows < num_rows
    col_mask = cols < N
    first_block = pid_k * blocks_per_split
    last_block = tl.minimum(first_block + blocks_per_split, tl.cdiv(K, BLOCK_K))
    if PREFETCH_LINES > 0:  # dependent launch: this program's weight lines into L2 while
        # the previous kernel finishes (no kernel writes weights: safe before the wait)
        prefetch_weight_rows(w_ptr, cols, col_mask, first_block,
                             tl.minimum(last_block, first_block + num_prefetch), N, K,
                             stride_wn, BLOCK_K, PREFETCH_LINES, EPILOGUE)
    wait_for_inputs(USE_PDL)
    if PROLOGUE == NORM:  # every program needs its rows' statistics over all of K
        store_rows = row_mask & ((tl.zeros([BLOCK_M], tl.int32) + pid_n + pid_k) == 0)
        rstd = inverse_rms(sum_squares(  # one program per row block stores h
            x_ptr, r_ptr, h_ptr, rows, row_mask, store_rows, stride_xm, stride_rm, stride_hm,
            K, HAS_RESIDUAL, BLOCK_M), K, eps)
    else:
        rstd = tl.zeros([BLOCK_M], tl.float32)  # unused
    x_ptrs = x_ptr + rows[:, None] * stride_xm + ks[None, :]  # (BM, BK)
    r_ptrs = r_ptr + rows[:, None] * stride_rm + ks[None, :]  # (BM, BK), NORM only
    w_ptrs = w_ptr + cols[None, :].to(tl.int64) * stride_wn + ks[:, None]  # (BK, BN)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    up_acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)  # EPILOGUE_SWIGLU only
    up_ptrs = w_ptrs + N * stride_wn  # the up rows of a [gate | up] weight
    for kb in range(first_block, last_block):  # the same K order for every row
        k0 = kb * BLOCK_K
        k_mask, a_mask, b_mask = k_block_masks(row_mask, col_mask, ks, k0, K, BLOCK_K, EVEN_K)
        b = tl.load(w_ptrs + k0, mask=b_mask, other=0.0)
        a = a_tile(x_ptrs + k0, r_ptrs + k0, nw_ptr + k0 + ks, a_mask, k_mask, rstd, K,
                   PROLOGUE, HAS_RESIDUAL)
        if DOT_IEEE:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        if EPILOGUE == EPILOGUE_SWIGLU:  # the up tile: the same A, the same K order
            b_up = tl.load(up_ptrs + k0, mask=b_mask, other=0.0)
            if DOT_IEEE:
                up_acc = tl.dot(a.to(tl.float32), b_up.to(tl.float32), up_acc,
                                input_precision="ieee")
            else:
                up_acc = tl.dot(a, b_up, up_acc)
    if EPILOGUE == EPILOGUE_SWIGLU:  # gate and up rounded as a stored gate_up would be
        dtype = out_ptr.dtype.element_ty
        acc = silu_times(acc.to(dtype), up_acc.to(dtype)).to(tl.float32)
    _store_tile(acc, bias_ptr, out_ptr, part_ptr, rows, cols, row_mask, col_mask, pid_k,
                num_rows, N, stride_om, HAS_BIAS, SPLIT_K)


@triton.jit
def k_block_masks(row_mask, col_mask, ks, k0, K, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """One K block's masks: (its columns (BK,), the A tile's, the B tile's)."""
    if EVEN_K:
        k_mask = ks < BLOCK_K
        a_mask = row_mask[:, None]
        b_mask = col_mask[None, :]
    else:
        k_mask = (k0 + ks) < K
        a_mask = row_mask[:, None] & k_mask[None, :]
        b_mask = col_mask[None, :] & k_mask[:, None]
    return k_mask, a_mask, b_mask


@triton.jit
def prefetch_weight_rows(w_ptr, cols, col_mask, first_block, last_block, N, K, stride_wn,
                         BLOCK_K: tl.constexpr, LINES: tl.constexpr, EPILOGUE: tl.constexpr):
    """One L2 prefetch per 128-byte line of the (BLOCK_N, K blocks [first_block,
    last_block)) weight rows this program reads first (LINES lines per BLOCK_K; the up
    rows too under the SwiGLU epilogue).
    Addresses past the weight fall back to the row's start (still a valid address)."""
    row_start = tl.where(col_mask, cols, 0).to(tl.int64) * stride_wn  # (BN,)
    line_k = tl.arange(0, LINES) * (BLOCK_K // LINES)  # (LINES,) first element of each line
    for kb in range(first_block, last_block):
        k = kb * BLOCK_K + line_k
        offs = tl.where((k < K)[None, :], row_start[:, None] + k[None, :], row_start[:, None])
        prefetch_l2(w_ptr + offs)
        if EPILOGUE == EPILOGUE_SWIGLU:
            prefetch_l2(w_ptr + N * stride_wn + offs)


@triton.jit
def _store_tile(acc, bias_ptr, out_ptr, part_ptr, rows, cols, row_mask, col_mask, pid_k,
                num_rows, N, stride_om, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr):
    """The (BM, BN) float32 tile: + bias, rounded to the output; or a split's partial."""
    mask = row_mask[:, None] & col_mask[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        part = part_ptr + (pid_k * num_rows + rows[:, None]) * N + cols[None, :]
        tl.store(part, acc, mask=mask)


@triton.jit(do_not_specialize=["num_rows"])
def _split_k_reduce_kernel(
    part_ptr, bias_ptr, out_ptr, r_ptr, nw_ptr, y_ptr, num_rows, N, eps, stride_om, stride_rm,
    stride_ym, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr,
    NORM: tl.constexpr = False, USE_PDL: tl.constexpr = False,
):
    """The splits' partials summed in split order (+ bias), rounded to the output. With
    NORM (one program per row, BLOCK >= N) the RMSNorm after the projection too: out gets
    h = out + residual (the residual stream) and y the normed h, the steps and the order
    of `rmsnorm._rms_norm_kernel` (the statistics read back from h as that kernel reads
    them): the same bits as the GEMM then `rms_norm(out, norm_weight, eps, residual)`."""
    wait_for_inputs(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    out = _split_sum(part_ptr, bias_ptr, out_ptr, r_ptr, row, cols, mask, num_rows, N,
                     stride_rm, HAS_BIAS, SPLIT_K, NORM)
    tl.store(out_ptr + row * stride_om + cols, out, mask=mask)
    if NORM:
        tl.debug_barrier()  # this program's stores of h visible to all its threads
        one = tl.full([1], True, tl.int1)
        sum_sq = sum_squares(out_ptr, out_ptr, out_ptr, row + tl.arange(0, 1), one, one,
                             stride_om, stride_om, stride_om, N, False, 1, 16)
        weight = tl.load(nw_ptr + cols, mask=mask, other=0.0)
        tl.store(y_ptr + row * stride_ym + cols,
                 rms_scale(out, inverse_rms(sum_sq, N, eps), weight), mask=mask)


@triton.jit
def _split_sum(part_ptr, bias_ptr, out_ptr, r_ptr, row, cols, mask, num_rows, N, stride_rm,
               HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, RESIDUAL: tl.constexpr):
    """One row's columns `cols` of a split-K output: the splits' partials summed in split
    order (+ bias), rounded to the output's dtype, the residual added (RESIDUAL, rounded
    as `residual_sum`)."""
    acc = tl.load(part_ptr + row * N + cols, mask=mask, other=0.0)
    for split in tl.static_range(1, SPLIT_K):  # split order: a fixed sum order
        acc += tl.load(part_ptr + (split * num_rows + row) * N + cols, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    out = acc.to(out_ptr.dtype.element_ty)
    if RESIDUAL:
        r = tl.load(r_ptr + row * stride_rm + cols, mask=mask, other=0.0)
        out = (out.to(tl.float32) + r.to(tl.float32)).to(out.dtype)
    return out


def dot_in_float32(x: Tensor) -> bool:
    """Whether a kernel's tl.dot runs on float32 operands (ieee, no tf32): float32 models,
    and bf16 under the CPU interpreter, whose dot multiplies bf16 bit patterns (triton
    issue 11584); the upcast is exact and the sums stay float32, as on tensor cores."""
    return x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and x.device.type == "cpu")


def invariant_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None,
                     out_dtype: torch.dtype | None = None) -> Tensor:
    """x: (T, K) contiguous; weight: (N, K) contiguous, x's dtype; bias: (N,) or None ->
    (T, N) in `out_dtype` (default x's dtype), float32 accumulation. Row t of the result
    is bitwise the same for any T: the K order is `linear_config(N, K, dtype)`'s."""
    config = linear_config(weight.shape[0], weight.shape[1], weight.dtype, x.shape[0])
    return linear_with_config(x, weight, bias, out_dtype, config)


def linear_with_config(x: Tensor, weight: Tensor, bias: Tensor | None,
                       out_dtype: torch.dtype | None, config: LinearConfig) -> Tensor:
    """`invariant_linear` with an explicit tiling (tests and tuning)."""
    check_operands(x, weight, bias, weight.shape[1])
    out = x.new_empty((x.shape[0], weight.shape[0]), dtype=out_dtype or x.dtype)
    launch_linear(x, weight, bias, out, config)
    return out


def check_operands(x: Tensor, weight: Tensor, bias: Tensor | None, x_width: int) -> None:
    """x: (T, x_width) contiguous; weight: (N, K) contiguous in x's dtype; bias (N,)."""
    assert x.dim() == 2 and weight.dim() == 2, (x.shape, weight.shape)
    assert x.is_contiguous() and weight.is_contiguous(), "x and weight must be contiguous"
    assert x.shape[1] == x_width, (x.shape, weight.shape)
    assert x.dtype == weight.dtype, (x.dtype, weight.dtype)
    assert x.dtype in (torch.bfloat16, torch.float16, torch.float32), x.dtype
    assert x.device == weight.device, (x.device, weight.device)
    if bias is not None:
        assert bias.shape == (weight.shape[0],) and bias.is_contiguous(), bias.shape
        assert bias.device == x.device, bias.device


def pipeline_stages(config: LinearConfig, prologue: int, element_size: int) -> int:
    """The tiling's stages, fewer where a prologue's tiles would not fit the shared memory
    the plain GEMM's tiling was tuned with: the 8B down projection's 6 stages of 64x64x128
    under the SwiGLU prologue (gate and up tiles a step) asked 256 KB of the H200's 227
    (lease 15). Each stage holds its A and B tiles; the float32 accumulator's layout change
    takes the rest (sm_90 compiles: 64x128x128 under the norm prologue needs 168 KB at 3
    stages, 232 at 4)."""
    if not prologue:
        return config.num_stages
    a_tiles = 2 if prologue == SWIGLU.value else 1
    stage_bytes = (a_tiles * config.block_m + config.block_n) * config.block_k * element_size
    room = SHARED_BYTES - 4 * config.block_m * config.block_n - 8192
    return max(2, min(config.num_stages, room // stage_bytes))


def splits_of(config: LinearConfig, in_features: int) -> int:
    """The K splits a launch of `config` makes over `in_features` (none empty)."""
    k_blocks = triton.cdiv(in_features, config.block_k)
    return triton.cdiv(k_blocks, triton.cdiv(k_blocks, config.split_k))


@dataclass(frozen=True)
class SplitPartials:
    """A split-K GEMM's output before its reduce: `part` (S, T, N) float32, split s's sums
    at part[s]; `bias` (N,) or None; `dtype` the output's. A consumer sums the splits in
    split order, adds the bias and rounds to `dtype`, as `_split_k_reduce_kernel` does
    (ddtree/kernels/rope.py: RoPE and the KV store straight from them)."""

    part: Tensor
    bias: Tensor | None
    dtype: torch.dtype

    @property
    def shape(self) -> tuple[int, int]:
        return self.part.shape[1], self.part.shape[2]


@dataclass(frozen=True)
class PendingLinear:
    """A GEMM not run yet, x @ weight.T (+ bias) with the weight's tiling: its consumer
    runs it with its own operation as the epilogue (rope.rope_store: RoPE and the KV store
    on the QKV GEMM's tiles) or, where that does not apply, `run()`s it as is."""

    x: Tensor
    weight: Tensor
    bias: Tensor | None

    @property
    def shape(self) -> tuple[int, int]:
        return self.x.shape[0], self.weight.shape[0]

    def run(self) -> Tensor:
        return invariant_linear(self.x, self.weight, self.bias)


def linear_partials(x: Tensor, weight: Tensor, bias: Tensor | None,
                    config: LinearConfig | None = None) -> SplitPartials | None:
    """`invariant_linear` without its reduce: the splits' partial sums for the consumer to
    finish (same K order, same bits once summed in split order); None where the tiling
    (`config`, default the weight's for T rows) does not split K."""
    config = config or linear_config(weight.shape[0], weight.shape[1], weight.dtype,
                                     x.shape[0])
    split_k = splits_of(config, weight.shape[1])
    if split_k == 1:
        return None
    check_operands(x, weight, bias, weight.shape[1])
    part = x.new_empty((split_k, x.shape[0], weight.shape[0]), dtype=torch.float32)
    launch_linear(x, weight, bias, part[0], config, partials=part)
    return SplitPartials(part, bias, x.dtype)


def weight_prefetch(weight: Tensor, config: LinearConfig, pdl: bool, split_k: int,
                    blocks_per_split: int) -> tuple[int, int]:
    """A GEMM launch's L2 prefetch of its weight under a dependent launch: (128-byte lines
    per BLOCK_K of a weight row, 0 for none; the first K blocks of each split to prefetch,
    within the L2 budget: all of a small weight)."""
    lines = (max(1, config.block_k * weight.element_size() // 128)
             if pdl and prefetch_enabled() else 0)
    num_prefetch = prefetch_blocks(
        weight.shape[0] * config.block_k * weight.element_size() * split_k, blocks_per_split)
    return lines, num_prefetch


def launch_linear(x: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor,
                  config: LinearConfig, prologue: int = 0, residual: Tensor | None = None,
                  norm_weight: Tensor | None = None, h: Tensor | None = None,
                  eps: float = 0.0, epilogue: int = 0,
                  norm_after: tuple[Tensor, Tensor, Tensor] | None = None,
                  partials: Tensor | None = None) -> None:
    """Writes out (T, N) = A @ weight.T (+ bias) for checked operands, A being x after
    `prologue` (prologues.py: 0 plain, 1 norm with residual / norm_weight / eps, storing
    x + residual in h, 2 SwiGLU on x = [gate | up]) and, with `epilogue` 1, out (T, N/2)
    = silu(gate) * up of a [gate | up] weight (no split-K, no bias); the tiling is
    `config` whatever T. `norm_after` = (residual, norm_weight, y) with a tiling that
    splits K: the reduce kernel also adds the residual (out gets h) and writes y =
    RMSNorm(h) (`eps`), one program per row (`_split_k_reduce_kernel`). `partials`
    (split_k, T, N) float32 with a tiling that splits K: the splits' sums are left there
    and no reduce runs (`linear_partials`)."""
    num_rows = x.shape[0]
    out_features, in_features = weight.shape
    if epilogue:
        assert config.split_k == 1 and bias is None and out_features % 2 == 0
        out_features //= 2
    if num_rows == 0:
        return
    k_blocks = triton.cdiv(in_features, config.block_k)
    blocks_per_split = triton.cdiv(k_blocks, config.split_k)
    split_k = splits_of(config, in_features)
    if partials is not None:
        assert split_k > 1 and partials.shape == (split_k, num_rows, out_features)
    part = partials if partials is not None else (
        x.new_empty((split_k, num_rows, out_features), dtype=torch.float32)
        if split_k > 1 else out)
    bias_arg = bias if bias is not None else out
    source = residual if residual is not None else x
    pdl = use_pdl(x)
    lines, num_prefetch = weight_prefetch(weight, config, pdl, split_k, blocks_per_split)
    grid = (triton.cdiv(num_rows, config.block_m), triton.cdiv(out_features, config.block_n),
            split_k)
    stages = pipeline_stages(config, prologue, x.element_size())
    _linear_kernel[grid](
        x, weight, bias_arg, out, part, source,
        norm_weight if norm_weight is not None else weight, h if h is not None else out,
        num_rows, out_features, in_features, blocks_per_split, num_prefetch, eps, x.stride(0),
        source.stride(0), h.stride(0) if h is not None else 0, weight.stride(0),
        out.stride(0), PROLOGUE=prologue, HAS_RESIDUAL=residual is not None,
        HAS_BIAS=bias is not None, SPLIT_K=split_k,
        EVEN_K=in_features % config.block_k == 0, BLOCK_M=config.block_m,
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, DOT_IEEE=dot_in_float32(x),
        EPILOGUE=epilogue, USE_PDL=pdl, PREFETCH_LINES=lines, num_warps=config.num_warps,
        num_stages=stages, **launch_kwargs(pdl),
    )
    if partials is not None:
        return
    if split_k > 1:
        block = 1024 if norm_after is None else triton.next_power_of_2(out_features)
        r_arg, nw_arg, y_arg = norm_after if norm_after is not None else (out, out, out)
        _split_k_reduce_kernel[(num_rows, triton.cdiv(out_features, block))](
            part, bias_arg, out, r_arg, nw_arg, y_arg, num_rows, out_features, eps,
            out.stride(0), r_arg.stride(0), y_arg.stride(0), HAS_BIAS=bias is not None,
            SPLIT_K=split_k, BLOCK=block, NORM=norm_after is not None, USE_PDL=pdl,
            num_warps=4 if block <= 1024 else min(16, block // 512), **launch_kwargs(pdl),
        )
    else:
        assert norm_after is None, "the norm rides on the reduce of a split-K tiling"
