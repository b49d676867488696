"""The attention prologue in one pass: split the fused QKV projection, apply the optional
per-head RMSNorm of Qwen3 (`q_norm`, `k_norm`), rotate q and k (RoPE, half-split
convention of HF Llama/Qwen3, angles in float32), and store k and v in the KV pool."""

from __future__ import annotations

import torch
from torch import Tensor


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
