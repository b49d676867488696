"""The attention prologue in one pass: split the fused QKV projection, apply the optional
per-head RMSNorm of Qwen3 (`q_norm`, `k_norm`), rotate q and k (RoPE, half-split
convention of HF Llama/Qwen3, angles in float32), and store k and v in the KV pool. Where
the QKV GEMM's tiling splits K the kernel takes the splits' partial sums instead of qkv
and finishes them as the GEMM's reduce would (matmul.SplitPartials): one launch fewer."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree.kernels.launch import launch_kwargs, use_pdl, wait_for_inputs
from ddtree.kernels.matmul import SplitPartials


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
    # Angles in float32, cos and sin rounded to the model dtype; each product and the sum
    # rounded to it too: `x * cos + rotate_half(x) * sin` done op by op in eager.
    angle = tl.load(positions_ptr + row).to(tl.float32) * tl.load(inv_freq_ptr + cols)
    cos = tl.cos(angle).to(dtype).to(tl.float32)
    sin = tl.sin(angle).to(dtype).to(tl.float32)
    out1 = ((x1 * cos).to(dtype).to(tl.float32) - (x2 * sin).to(dtype).to(tl.float32)).to(dtype)
    out2 = ((x2 * cos).to(dtype).to(tl.float32) + (x1 * sin).to(dtype).to(tl.float32)).to(dtype)
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
    qkv: Tensor | SplitPartials, positions: Tensor, inv_freq: Tensor, k_cache: Tensor,
    v_cache: Tensor,
    write_slot: Tensor, write_pos: Tensor, num_heads: int, num_kv_heads: int,
    q_norm_weight: Tensor | None = None, k_norm_weight: Tensor | None = None,
    eps: float = 1e-6,
) -> Tensor:
    """The Triton kernel of `rope_store_reference` (same arguments and rounding), one pass
    over qkv: (T, (Hq + 2*Hkv) * D) with contiguous rows; positions, write_slot,
    write_pos: (T,) int; inv_freq: (D/2,) float32; k_cache, v_cache: (num_slots, max_len,
    Hkv, D), head dim contiguous. Writes k and v into the pool; returns q: (T, Hq, D).
    qkv may be the QKV GEMM's split partials (matmul.linear_partials): the same bits as
    their reduce's qkv, without the reduce's launch."""
    partials = qkv if isinstance(qkv, SplitPartials) else None
    if partials is not None:
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
