"""Static per-layer key/value cache shared by the target and the drafter.

One preallocated buffer per K and V, `(num_layers, B, Hkv, max_len, D)`, so nothing is
reallocated per round and the layout is CUDA-graph friendly. The cache does not store
lengths: the caller owns `cache_lens (B,)` and commits them, which keeps every write here
free of host synchronisation. K is stored after RoPE (and after k_norm for Qwen3)."""

from __future__ import annotations

import torch
from torch import Tensor


def write_rows(buffer: Tensor, offsets: Tensor, rows: Tensor) -> None:
    """Writes `rows` into `buffer` at per-row slots, in place, without a host sync.

    buffer: (B, Hkv, max_len, D) (one layer of a cache; a view is fine);
    offsets: (B, M) int64 slot of each new row (e.g. `cache_lens[:, None] + arange(M)`),
    distinct per batch row; rows: (B, Hkv, M, D)."""
    batch, num_heads, num_rows, head_dim = rows.shape
    index = offsets[:, None, :, None].expand(batch, num_heads, num_rows, head_dim)  # (B, Hkv, M, D)
    buffer.scatter_(2, index, rows.to(buffer.dtype))


class KVCache:
    """K/V buffers `k`, `v`: (num_layers, B, Hkv, max_len, D)."""

    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, max_len: int,
                 head_dim: int, device: torch.device | str, dtype: torch.dtype) -> None:
        shape = (num_layers, batch, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def write(self, layer: int, offsets: Tensor, k: Tensor, v: Tensor) -> None:
        """Stores one layer's new rows. offsets: (B, M) int64 slots; k, v: (B, Hkv, M, D)."""
        write_rows(self.k[layer], offsets, k)
        write_rows(self.v[layer], offsets, v)

    def compact(self, start: int, keep: Tensor) -> None:
        """Moves slot `start + keep[b, j]` to slot `start + j` in every layer, in place.

        keep: (B, A) int64 offsets relative to `start`, strictly increasing per row (an
        accepted tree path). Slots beyond `start + A` keep stale data; the caller's lengths
        say they are free. No RoPE fix-up is needed: a path node at depth j was already
        encoded at position `start + j`."""
        num_layers, batch, num_heads, _, head_dim = self.k.shape
        num_keep = keep.shape[1]
        index = (start + keep)[None, :, None, :, None].expand(
            num_layers, batch, num_heads, num_keep, head_dim)  # (layers, B, Hkv, A, D)
        for buffer in (self.k, self.v):
            # gather copies first, so overlapping source and destination slots are safe.
            kept = buffer.gather(3, index)  # (layers, B, Hkv, A, D)
            buffer[:, :, :, start:start + num_keep] = kept
