"""The attention prologue in one pass: split the fused QKV projection, apply the optional
per-head RMSNorm of Qwen3 (`q_norm`, `k_norm`), rotate q and k (RoPE, half-split
convention of HF Llama/Qwen3, angles in float32), and store k and v in the KV pool. Where
the QKV GEMM's tiling splits K the kernel takes the splits' partial sums instead of qkv
and finishes them as the GEMM's reduce would (matmul.SplitPartials): one launch fewer.
Where it does not (and there are no head norms), the GEMM runs these steps as its
epilogue (matmul.PendingLinear, `_linear_rope_kernel`): one launch instead of two."""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree.kernels.launch import launch_kwargs, use_pdl, wait_for_inputs
from ddtree.kernels.matmul import (
    EPILOGUE_SWIGLU,
    LinearConfig,
    PendingLinear,
    SplitPartials,
    check_operands,
    dot_in_float32,
    k_block_masks,
    linear_config,
    prefetch_weight_rows,
    splits_of,
    weight_prefetch,
)


def rope_store_reference(
    qkv: Tensor, positions: Tensor, inv_freq: Tensor, k_cache: Tensor, v_cache: Tensor,
    write_slot: Tensor, write_pos: Tensor, num_heads: int, num_kv_heads: int,
    q_norm_weight: Tensor | None = None, k_norm_weight: Tensor | None = None,
    eps: float = 1e-6,
) -> Tensor:
    """qkv: (T, (Hq + 2*Hkv) * D) = [q | k | v]; positions: (T,) int; inv_freq: (D/2,)
    float32; k_cache, v_cache: (num_slots, max_len, Hkv, D); write_slot, write_pos: (T,)
    int, where row t's k and v go. Returns the rotated q: (T, Hq, D) in qkv's dtype.

    Rounding follows the models' eager path: norms in float32 then cast; cos and sin
    computed in float32 and cast to the model dtype; `x * cos + rotate_half(x) * sin` in
    the model dtype."""
    num_rows = qkv.shape[0]
    head_dim = qkv.shape[1] // (num_heads + 2 * num_kv_heads)
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim,
                         num_kv_heads * head_dim], dim=1)
    q = q.reshape(num_rows, num_heads, head_dim)  # (T, Hq, D)
    k = k.reshape(num_rows, num_kv_heads, head_dim)  # (T, Hkv, D)
    v = v.reshape(num_rows, num_kv_heads, head_dim)
    if q_norm_weight is not None and k_norm_weight is not None:
        q, k = _head_norm(q, q_norm_weight, eps), _head_norm(k, k_norm_weight, eps)
    freqs = positions.float()[:, None] * inv_freq  # (T, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # (T, 1, D)
    cos, sin = emb.cos().to(qkv.dtype), emb.sin().to(qkv.dtype)
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    k_cache[write_slot.long(), write_pos.long()] = k.to(k_cache.dtype)
    v_cache[write_slot.long(), write_pos.long()] = v.to(v_cache.dtype)
    return q


def _head_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


@triton.jit
def _qkv_values(qkv_ptr, part_ptr, bias_ptr, row, col, stride_row, num_rows, width, dtype,
                SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr):
    """qkv[row, col] (col a vector) as float32: loaded (SPLIT_K 0), or the SPLIT_K
    partial sums added in split order (+ bias) and rounded to dtype, as
    `matmul._split_k_reduce_kernel` stores them."""
    if SPLIT_K == 0:
        return tl.load(qkv_ptr + row * stride_row + col).to(tl.float32)
    acc = tl.load(part_ptr + row * width + col)
    for split in tl.static_range(1, SPLIT_K):
        acc += tl.load(part_ptr + (split * num_rows + row) * width + col)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + col).to(tl.float32)
    return acc.to(dtype).to(tl.float32)


@triton.jit
def _rotate_halves(x1, x2, angle, dtype: tl.constexpr):
    """RoPE of a head's halves x1, x2 (float32 holding model-dtype values) at `angle`
    (float32, same shape): cos and sin rounded to the model dtype; each product and the
    sum rounded to it too (`x * cos + rotate_half(x) * sin` done op by op in eager) ->
    (out1, out2) in dtype. Launch without fp contraction (see `rope_store`)."""
    cos = tl.cos(angle).to(dtype).to(tl.float32)
    sin = tl.sin(angle).to(dtype).to(tl.float32)
    out1 = ((x1 * cos).to(dtype).to(tl.float32) - (x2 * sin).to(dtype).to(tl.float32)).to(dtype)
    out2 = ((x2 * cos).to(dtype).to(tl.float32) + (x1 * sin).to(dtype).to(tl.float32)).to(dtype)
    return out1, out2


@triton.jit(do_not_specialize=["num_rows"])
def _rope_store_kernel(
    qkv_ptr, part_ptr, bias_ptr, positions_ptr, inv_freq_ptr, k_cache_ptr, v_cache_ptr,
    write_slot_ptr, write_pos_ptr, q_norm_ptr, k_norm_ptr, q_out_ptr, eps, num_rows, width,
    stride_row, stride_ks, stride_kp, stride_kh, stride_vs, stride_vp, stride_vh,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr, HAS_NORM: tl.constexpr, SPLIT_K: tl.constexpr = 0,
    HAS_BIAS: tl.constexpr = False, USE_PDL: tl.constexpr = False,
):
    """Program (t, h): query head h < Hq, or key head h - Hq together with value head
    h - Hq. Row t's arithmetic never looks at another row. qkv is read from qkv_ptr, or
    (SPLIT_K > 0) finished from a split-K GEMM's partials (`_qkv_values`)."""
    wait_for_inputs(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    cols = tl.arange(0, HALF)
    dtype = q_out_ptr.dtype.element_ty
    first = head * HEAD_DIM  # q heads, then k heads
    x1 = _qkv_values(qkv_ptr, part_ptr, bias_ptr, row, first + cols, stride_row, num_rows,
                     width, dtype, SPLIT_K, HAS_BIAS)
    x2 = _qkv_values(qkv_ptr, part_ptr, bias_ptr, row, first + HALF + cols, stride_row,
                     num_rows, width, dtype, SPLIT_K, HAS_BIAS)
    if HAS_NORM:  # Qwen3's per-head RMSNorm: float32 statistics, cast, then weight
        if head < NUM_HEADS:
            w1 = tl.load(q_norm_ptr + cols).to(tl.float32)
            w2 = tl.load(q_norm_ptr + HALF + cols).to(tl.float32)
        else:
            w1 = tl.load(k_norm_ptr + cols).to(tl.float32)
            w2 = tl.load(k_norm_ptr + HALF + cols).to(tl.float32)
        rstd = tl.rsqrt((tl.sum(x1 * x1, 0) + tl.sum(x2 * x2, 0)) / HEAD_DIM + eps)
        x1 = (w1 * (x1 * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        x2 = (w2 * (x2 * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    angle = tl.load(positions_ptr + row).to(tl.float32) * tl.load(inv_freq_ptr + cols)
    out1, out2 = _rotate_halves(x1, x2, angle, dtype)
    if head < NUM_HEADS:
        dst = q_out_ptr + (row * NUM_HEADS + head) * HEAD_DIM
        tl.store(dst + cols, out1)
        tl.store(dst + HALF + cols, out2)
    else:
        kv_head = head - NUM_HEADS
        slot = tl.load(write_slot_ptr + row).to(tl.int64)
        pos = tl.load(write_pos_ptr + row).to(tl.int64)
        k_dst = k_cache_ptr + slot * stride_ks + pos * stride_kp + kv_head * stride_kh
        cache_dtype = k_cache_ptr.dtype.element_ty
        tl.store(k_dst + cols, out1.to(cache_dtype))
        tl.store(k_dst + HALF + cols, out2.to(cache_dtype))
        all_cols = tl.arange(0, HEAD_DIM)
        v = _qkv_values(qkv_ptr, part_ptr, bias_ptr, row,
                        first + NUM_KV_HEADS * HEAD_DIM + all_cols, stride_row, num_rows,
                        width, dtype, SPLIT_K, HAS_BIAS)
        v_dst = v_cache_ptr + slot * stride_vs + pos * stride_vp + kv_head * stride_vh
        tl.store(v_dst + all_cols, v.to(v_cache_ptr.dtype.element_ty))


def rope_store(
    qkv: Tensor | SplitPartials | PendingLinear, positions: Tensor, inv_freq: Tensor,
    k_cache: Tensor, v_cache: Tensor,
    write_slot: Tensor, write_pos: Tensor, num_heads: int, num_kv_heads: int,
    q_norm_weight: Tensor | None = None, k_norm_weight: Tensor | None = None,
    eps: float = 1e-6,
) -> Tensor:
    """The Triton kernel of `rope_store_reference` (same arguments and rounding), one pass
    over qkv: (T, (Hq + 2*Hkv) * D) with contiguous rows; positions, write_slot,
    write_pos: (T,) int; inv_freq: (D/2,) float32; k_cache, v_cache: (num_slots, max_len,
    Hkv, D), head dim contiguous. Writes k and v into the pool; returns q: (T, Hq, D).
    qkv may be the QKV GEMM's split partials (matmul.linear_partials): the same bits as
    their reduce's qkv, without the reduce's launch; or the QKV GEMM not run yet
    (matmul.PendingLinear): where its tiling does not split K and there are no head norms
    the GEMM runs with this kernel's steps as its epilogue (`_linear_rope_kernel`: the
    same bits, one launch); otherwise it runs first."""
    pending, epilogue = None, None  # the GEMM to run with this kernel as its epilogue
    if isinstance(qkv, PendingLinear):
        epilogue = rope_epilogue_config(qkv, num_heads, num_kv_heads,
                                        q_norm_weight is not None)
        pending, qkv = (qkv, qkv) if epilogue is not None else (None, qkv.run())
    partials = qkv if isinstance(qkv, SplitPartials) else None
    if pending is not None:
        dtype, device = pending.x.dtype, pending.x.device
    elif partials is not None:
        assert partials.part.dim() == 3 and partials.part.is_contiguous(), partials.part.shape
        assert partials.part.dtype == torch.float32, partials.part.dtype
        dtype, device = partials.dtype, partials.part.device
        qkv = partials.part[0]  # (T, width) float32: a stand-in pointer, not read
    else:
        assert isinstance(qkv, Tensor)
        assert qkv.dim() == 2 and qkv.stride(1) == 1, "qkv must be (T, width), rows contiguous"
        dtype, device = qkv.dtype, qkv.device
    assert dtype in (torch.bfloat16, torch.float16, torch.float32), dtype
    num_rows, width = qkv.shape
    head_dim = width // (num_heads + 2 * num_kv_heads)
    assert head_dim * (num_heads + 2 * num_kv_heads) == width, (width, num_heads, num_kv_heads)
    assert head_dim in (64, 128), f"head dim {head_dim}"
    assert inv_freq.shape == (head_dim // 2,) and inv_freq.dtype == torch.float32
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        assert cache.dim() == 4 and cache.shape[2:] == (num_kv_heads, head_dim), name
        assert cache.stride(3) == 1 and cache.device == device, name
    for name, meta in (("positions", positions), ("write_slot", write_slot),
                       ("write_pos", write_pos)):
        assert meta.shape == (num_rows,) and meta.is_contiguous(), f"{name}: {meta.shape}"
        assert meta.dtype in (torch.int32, torch.int64) and meta.device == device, name
    has_norm = q_norm_weight is not None and k_norm_weight is not None
    assert (q_norm_weight is None) == (k_norm_weight is None), "both head norms or neither"
    if has_norm:
        for weight in (q_norm_weight, k_norm_weight):
            assert weight is not None and weight.shape == (head_dim,) and weight.is_contiguous()
            assert weight.dtype == dtype, weight.dtype
    q = torch.empty((num_rows, num_heads, head_dim), dtype=dtype, device=device)
    if num_rows == 0:
        return q
    if pending is not None and epilogue is not None:
        _launch_linear_rope(pending, epilogue, positions, inv_freq, k_cache, v_cache,
                            write_slot, write_pos, q)
        return q
    assert isinstance(qkv, Tensor)  # qkv, or (split partials) a stand-in for its pointer
    norm_q = q_norm_weight if q_norm_weight is not None else inv_freq
    norm_k = k_norm_weight if k_norm_weight is not None else inv_freq
    pdl = use_pdl(qkv)
    bias = partials.bias if partials is not None else None
    _rope_store_kernel[(num_rows, num_heads + num_kv_heads)](
        qkv, partials.part if partials is not None else qkv, bias if bias is not None else q,
        positions, inv_freq, k_cache, v_cache, write_slot, write_pos, norm_q, norm_k, q,
        eps, num_rows, width, qkv.stride(0), *k_cache.stride()[:3], *v_cache.stride()[:3],
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        HALF=head_dim // 2, HAS_NORM=has_norm,
        SPLIT_K=partials.part.shape[0] if partials is not None else 0,
        HAS_BIAS=bias is not None, USE_PDL=pdl,
        num_warps=1 if head_dim <= 64 else 2,
        # no contraction: the compiler turns `x * cos` rounded to the model dtype, then a
        # subtraction, into one bf16 FMA (one rounding where eager has two: 22% of q's
        # elements differed from eager on the H200, lease 12)
        enable_fp_fusion=False, **launch_kwargs(pdl),
    )
    return q


# ------------------------------------------------------------------ the RoPE epilogue
# Where the QKV GEMM does not split K and the model has no head norms (Llama, SmolLM2),
# the GEMM itself rotates and stores: each program accumulates BLOCK_N columns of one
# head's first half and the BLOCK_N columns HALF to their right (the same A tile, the same
# K order: each column's sum is the plain GEMM's, as under the SwiGLU epilogue), rounds
# both as the stored qkv would be, and takes `_rope_store_kernel`'s steps (`_rotate_halves`)
# for a q or k head, or stores a v head's values. A q or k tile goes through qkv (stored,
# then read back 16 rows at a time within the program) so that the rotation's float work
# covers only the rows that exist: rotating the whole 64-row tile made the kernel slower
# than the GEMM then `rope_store` at T = 1 (H200, lease 34: 6.40 against 5.46 us). One
# launch a layer fewer than the GEMM then `rope_store`.


def rope_epilogue_config(pending: PendingLinear, num_heads: int, num_kv_heads: int,
                         has_norm: bool) -> LinearConfig | None:
    """The tiling of the QKV GEMM with the RoPE epilogue: the weight's own for T rows (its
    K order; matmul.linear_config) with BLOCK_N halved (at most half a head, at least 16),
    or None where the epilogue does not apply (a tiling that splits K, head norms)."""
    weight = pending.weight
    width, hidden = weight.shape
    head_dim = width // (num_heads + 2 * num_kv_heads)
    return _rope_epilogue_config(width, hidden, weight.dtype, pending.x.shape[0], head_dim,
                                 has_norm)


@functools.lru_cache(maxsize=256)
def _rope_epilogue_config(width: int, hidden: int, dtype: torch.dtype, num_rows: int,
                          head_dim: int, has_norm: bool) -> LinearConfig | None:
    config = linear_config(width, hidden, dtype, num_rows)
    half = head_dim // 2
    block_n = min(half, max(16, config.block_n // 2))
    if has_norm or splits_of(config, hidden) != 1 or half % block_n:
        return None
    return dataclasses.replace(config, block_n=block_n)


@triton.jit(do_not_specialize=["num_rows", "num_prefetch"])
def _linear_rope_kernel(
    x_ptr, w_ptr, bias_ptr, positions_ptr, inv_freq_ptr, k_cache_ptr, v_cache_ptr,
    write_slot_ptr, write_pos_ptr, q_out_ptr, qkv_ptr, num_rows, K, num_prefetch, stride_xm,
    stride_wn, stride_ks, stride_kp, stride_kh, stride_vs, stride_vp, stride_vh,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr, WIDTH: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_IEEE: tl.constexpr, ROWS: tl.constexpr = 16, USE_PDL: tl.constexpr = False,
    PREFETCH_LINES: tl.constexpr = 0,
):
    """Program (m, n): rows m * BLOCK_M.., head n // (HALF / BLOCK_N) (q heads, then k, then
    v), its columns j, j + HALF for the BLOCK_N values of j its part n % (HALF / BLOCK_N)
    names. The main loop is `matmul._linear_kernel`'s (no split, plain A tiles)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    head = pid_n // (HALF // BLOCK_N)
    half_cols = (pid_n % (HALF // BLOCK_N)) * BLOCK_N + tl.arange(0, BLOCK_N)  # j < HALF
    cols = head * HEAD_DIM + half_cols  # first-half columns of qkv; + HALF the second's
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    row_mask = rows < num_rows
    col_mask = cols >= 0  # every column exists (BLOCK_N divides HALF)
    num_blocks = tl.cdiv(K, BLOCK_K)
    if PREFETCH_LINES > 0:  # both halves' weight rows (the "up" offset: HALF rows below)
        prefetch_weight_rows(w_ptr, cols, col_mask, 0, tl.minimum(num_blocks, num_prefetch),
                             HALF, K, stride_wn, BLOCK_K, PREFETCH_LINES, EPILOGUE_SWIGLU)
    wait_for_inputs(USE_PDL)
    x_ptrs = x_ptr + rows[:, None] * stride_xm + ks[None, :]  # (BM, BK)
    w_ptrs = w_ptr + cols[None, :].to(tl.int64) * stride_wn + ks[:, None]  # (BK, BN)
    second_ptrs = w_ptrs + HALF * stride_wn
    acc1 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for kb in range(0, num_blocks):  # the plain GEMM's K order
        k0 = kb * BLOCK_K
        _, a_mask, b_mask = k_block_masks(row_mask, col_mask, ks, k0, K, BLOCK_K, EVEN_K)
        b1 = tl.load(w_ptrs + k0, mask=b_mask, other=0.0)
        a = tl.load(x_ptrs + k0, mask=a_mask, other=0.0)
        b2 = tl.load(second_ptrs + k0, mask=b_mask, other=0.0)
        if DOT_IEEE:
            acc1 = tl.dot(a.to(tl.float32), b1.to(tl.float32), acc1, input_precision="ieee")
            acc2 = tl.dot(a.to(tl.float32), b2.to(tl.float32), acc2, input_precision="ieee")
        else:
            acc1 = tl.dot(a, b1, acc1)
            acc2 = tl.dot(a, b2, acc2)
    dtype = q_out_ptr.dtype.element_ty
    if HAS_BIAS:  # as `matmul._store_tile`: + bias in float32, then rounded
        acc1 += tl.load(bias_ptr + cols).to(tl.float32)[None, :]
        acc2 += tl.load(bias_ptr + HALF + cols).to(tl.float32)[None, :]
    mask = row_mask[:, None]
    if head < NUM_HEADS + NUM_KV_HEADS:  # q or k: rotated, ROWS rows at a time
        # The tile's rounded values go to qkv (as the plain GEMM stores them) and come back
        # ROWS rows at a time: the rotation's float work is then spent on the rows that
        # exist (at T = 1 a whole tile of cos / sin took ~3 us on 4 warps).
        tile = qkv_ptr + rows[:, None] * WIDTH + cols[None, :]
        tl.store(tile, acc1.to(dtype), mask=mask)
        tl.store(tile + HALF, acc2.to(dtype), mask=mask)
        tl.debug_barrier()  # this program's stores visible to all its threads
        inv_freq = tl.load(inv_freq_ptr + half_cols)
        first_row = pid_m.to(tl.int64) * BLOCK_M
        last_row = tl.minimum(first_row + BLOCK_M, num_rows)
        for start in range(first_row, last_row, ROWS):
            chunk = start + tl.arange(0, ROWS)
            chunk_mask = chunk < last_row
            values = qkv_ptr + chunk[:, None] * WIDTH + cols[None, :]
            x1 = tl.load(values, mask=chunk_mask[:, None], other=0.0).to(tl.float32)
            x2 = tl.load(values + HALF, mask=chunk_mask[:, None], other=0.0).to(tl.float32)
            position = tl.load(positions_ptr + chunk, mask=chunk_mask, other=0).to(tl.float32)
            out1, out2 = _rotate_halves(x1, x2, position[:, None] * inv_freq[None, :], dtype)
            if head < NUM_HEADS:
                dst = (q_out_ptr + (chunk[:, None] * NUM_HEADS + head) * HEAD_DIM
                       + half_cols[None, :])
                tl.store(dst, out1, mask=chunk_mask[:, None])
                tl.store(dst + HALF, out2, mask=chunk_mask[:, None])
            else:
                k_dst = _pool_rows(k_cache_ptr, write_slot_ptr, write_pos_ptr, chunk,
                                   chunk_mask, head - NUM_HEADS, stride_ks, stride_kp,
                                   stride_kh) + half_cols[None, :]
                cache_dtype = k_cache_ptr.dtype.element_ty
                tl.store(k_dst, out1.to(cache_dtype), mask=chunk_mask[:, None])
                tl.store(k_dst + HALF, out2.to(cache_dtype), mask=chunk_mask[:, None])
    else:  # v: stored as rounded, straight from the tile
        v_dst = _pool_rows(v_cache_ptr, write_slot_ptr, write_pos_ptr, rows, row_mask,
                           head - NUM_HEADS - NUM_KV_HEADS, stride_vs, stride_vp, stride_vh)
        cache_dtype = v_cache_ptr.dtype.element_ty
        tl.store(v_dst + half_cols[None, :], acc1.to(dtype).to(cache_dtype), mask=mask)
        tl.store(v_dst + HALF + half_cols[None, :], acc2.to(dtype).to(cache_dtype), mask=mask)


@triton.jit
def _pool_rows(cache_ptr, write_slot_ptr, write_pos_ptr, rows, row_mask, kv_head,
               stride_s, stride_p, stride_h):
    """(BM, 1) pointers to where each row's head `kv_head` goes in a pool layer."""
    slot = tl.load(write_slot_ptr + rows, mask=row_mask, other=0).to(tl.int64)
    pos = tl.load(write_pos_ptr + rows, mask=row_mask, other=0).to(tl.int64)
    return (cache_ptr + slot * stride_s + pos * stride_p + kv_head * stride_h)[:, None]


def _launch_linear_rope(pending: PendingLinear, config: LinearConfig, positions: Tensor,
                        inv_freq: Tensor, k_cache: Tensor, v_cache: Tensor,
                        write_slot: Tensor, write_pos: Tensor, q: Tensor) -> None:
    """The RoPE-epilogue GEMM for checked operands (`rope_store`)."""
    x, weight, bias = pending.x, pending.weight, pending.bias
    check_operands(x, weight, bias, weight.shape[1])
    num_rows, hidden = x.shape
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    pdl = use_pdl(x)
    lines, num_prefetch = weight_prefetch(weight, config, pdl, 1,
                                          triton.cdiv(hidden, config.block_k))
    heads = num_heads + 2 * num_kv_heads
    grid = (triton.cdiv(num_rows, config.block_m), heads * (head_dim // 2 // config.block_n))
    qkv = x.new_empty((num_rows, heads * head_dim))  # q's and k's values between the steps
    _linear_rope_kernel[grid](
        x, weight, bias if bias is not None else q, positions, inv_freq, k_cache, v_cache,
        write_slot, write_pos, q, qkv, num_rows, hidden, num_prefetch, x.stride(0),
        weight.stride(0), *k_cache.stride()[:3], *v_cache.stride()[:3],
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        HALF=head_dim // 2, WIDTH=heads * head_dim, HAS_BIAS=bias is not None,
        EVEN_K=hidden % config.block_k == 0, BLOCK_M=config.block_m,
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, DOT_IEEE=dot_in_float32(x),
        USE_PDL=pdl, PREFETCH_LINES=lines, num_warps=config.num_warps,
        num_stages=config.num_stages,
        enable_fp_fusion=False,  # as `_rope_store_kernel`'s (the dots are MMAs either way)
        **launch_kwargs(pdl),
    )
