"""The KV pool: static K/V for every pool row, allocated once at start-up.

`k`, `v`: (num_layers, num_slots, max_len, Hkv, D), contiguous, so one layer is a
(num_slots, max_len, Hkv, D) view the attention kernel reads with plain strides and one
token's keys (all heads) are contiguous. The pool stores no lengths: the engine owns
them (device tensors) and decides what is committed. K is stored after RoPE (and after
k_norm for Qwen3).
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVPool:
    """K/V buffers for `num_slots` rows of `max_len` token slots in every layer."""

    def __init__(self, num_layers: int, num_slots: int, max_len: int, num_kv_heads: int,
                 head_dim: int, device: torch.device | str, dtype: torch.dtype) -> None:
        shape = (num_layers, num_slots, max_len, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)

    @property
    def num_slots(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        """K and V of one token in every layer."""
        return 2 * num_layers * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8

    def compact(self, slots: Tensor, start: Tensor, keep: Tensor) -> None:
        """Moves slot `start[b] + keep[b, j]` of row `slots[b]` to slot `start[b] + j`, in
        every layer, in place, without a host sync.

        slots, start: (B,) int64; keep: (B, A) int64 offsets relative to start, the
        accepted path (its entries past the acceptance length may be anything in range:
        they land beyond the committed length, in slots the engine treats as free). The
        gather copies first, so overlapping source and destination slots are safe. No
        RoPE fix-up: a path node at depth j was already encoded at position start + j."""
        rows = slots[:, None].expand_as(keep)  # (B, A)
        destination = start[:, None] + torch.arange(keep.shape[1], device=keep.device)
        source = start[:, None] + keep
        for buffer in (self.k, self.v):
            buffer[:, rows, destination] = buffer[:, rows, source]  # (layers, B, A, Hkv, D)
