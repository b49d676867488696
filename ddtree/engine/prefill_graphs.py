"""Prefill in static shapes, so that it replays as a CUDA graph instead of running eagerly.

The prompts admitted in one step are padded to a token bucket (16, 32, ... tokens): the
padding tokens write their K/V into the scratch row at slot 0 and attend only to it, so
no real row sees them. The LM head reads a fixed number of rows, each prompt's last token
first (the rest repeat token 0). Every value a graph reads sits in its bucket's static
buffers, filled from the host by ONE copy; the graph's outputs are static too, so a caller
that keeps a prompt's features past the next prefill copies them.

Why: eagerly a prefill is hundreds of kernel launches issued from Python (~30 ms for a
150-token prompt on the H200, measured as time to first token), and every running row
waits for it; replayed it costs the GPU time of one forward. The kernels make each real
row's K/V, logits and features bitwise those of its prefill alone, padding or not.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ddtree.engine.graphs import GraphRunner
from ddtree.models.kv_pool import KVPool
from ddtree.models.meta import AttentionMeta
from ddtree.models.target import TargetModel, TargetOutput

MIN_TOKENS = 16
# The largest bucket: the attention workspace grows with tokens x splits; longer prefills
# (rare, and long enough that launches no longer dominate) run eagerly.
MAX_TOKENS = 2048
# Rows the LM head reads (prompts per static prefill); more admitted at once run eagerly.
MAX_ROWS = 32
# Planes of a bucket's int64 buffer, each `num_tokens` long, then the LM head's rows.
IDS, POSITIONS, SLOTS, PREFIX = range(4)


def token_buckets(largest: int) -> tuple[int, ...]:
    """The static token buckets MIN_TOKENS, 2x, ... up to min(largest, MAX_TOKENS): the
    prefill's and the drafter service's first contexts (`ContextGraphs`)."""
    largest = min(largest, MAX_TOKENS)
    return tuple(MIN_TOKENS << i for i in range((largest // MIN_TOKENS).bit_length()))


class PrefillBuffers:
    """The static inputs of one token bucket: ids, positions, pool rows and prefix lengths
    (T,), the LM head's rows (R,), and the AttentionMeta built on them."""

    def __init__(self, num_tokens: int, num_rows: int, max_kv_len: int,
                 device: torch.device) -> None:
        self.num_tokens, self.num_rows = num_tokens, num_rows
        size = 4 * num_tokens + num_rows
        self.host = torch.zeros(size, dtype=torch.long, pin_memory=device.type == "cuda")
        self.ints = torch.zeros(size, dtype=torch.long, device=device)
        planes = self.ints[: 4 * num_tokens].view(4, num_tokens)  # (4, T)
        self.ids, self.logit_rows = planes[IDS], self.ints[4 * num_tokens:]
        zeros = torch.zeros(num_tokens, dtype=torch.long, device=device)
        self.meta = AttentionMeta(
            positions=planes[POSITIONS], write_slot=planes[SLOTS], write_pos=planes[POSITIONS],
            query_slot=planes[SLOTS], prefix_len=planes[PREFIX], tree_base=zeros,
            tree_keys=zeros[:, None], num_tree_keys=zeros, max_kv_len=max_kv_len)

    def fill(self, prompts: Sequence[Sequence[int]], slots: Sequence[int], scratch: int) -> None:
        """Writes the step's prompts (each causal in its own pool row, positions 0..) and
        the padding, then copies everything to the device at once."""
        lengths = np.array([len(p) for p in prompts], dtype=np.int64)
        total, ends = int(lengths.sum()), np.cumsum(lengths)
        assert total <= self.num_tokens and len(prompts) <= self.num_rows, (total, len(prompts))
        host = self.host.numpy()
        planes = host[: 4 * self.num_tokens].reshape(4, self.num_tokens)
        positions = np.arange(total) - np.repeat(ends - lengths, lengths)
        planes[IDS, :total] = np.concatenate([np.asarray(p, dtype=np.int64) for p in prompts])
        planes[POSITIONS, :total] = positions
        planes[SLOTS, :total] = np.repeat(np.asarray(slots, dtype=np.int64), lengths)
        planes[PREFIX, :total] = positions + 1
        planes[:, total:] = np.array([[0], [0], [scratch], [1]])  # padding: scratch slot 0
        rows = host[4 * self.num_tokens:]
        rows[:] = 0
        rows[: len(prompts)] = ends - 1
        self.ints.copy_(self.host, non_blocking=True)


class PrefillGraphs:
    """Static prefills over one target and pool; graphs captured per (bucket, feature
    layers) in the engine's GraphRunner (eager when graphs are off, e.g. on the CPU)."""

    def __init__(self, graphs: GraphRunner, scratch: int, max_len: int, max_rows: int,
                 max_tokens: int, device: torch.device) -> None:
        self.graphs, self.scratch, self.max_len, self.device = graphs, scratch, max_len, device
        self.num_rows = min(max_rows, MAX_ROWS)
        self.buckets = token_buckets(max(MIN_TOKENS, 1 << (max_tokens - 1).bit_length()))
        self._buffers: dict[int, PrefillBuffers] = {}

    def fits(self, num_tokens: int, num_rows: int) -> bool:
        return num_tokens <= self.buckets[-1] and num_rows <= self.num_rows

    def warm_up(self, target: TargetModel, pool: KVPool, feature_layers: Sequence[int]) -> int:
        """Captures every bucket (largest first) on a one-token prompt in the scratch row,
        before any request: a bucket's graph does not depend on how much of it the
        prompts fill. -> buckets captured."""
        for size in reversed(self.buckets):
            self.forward(target, pool, [[0]], [self.scratch], feature_layers, size)
        return len(self.buckets)

    def forward(self, target: TargetModel, pool: KVPool, prompts: Sequence[Sequence[int]],
                slots: Sequence[int], feature_layers: Sequence[int],
                size: int | None = None) -> TargetOutput:
        """The prompts' forward (the caller checked `fits`) in the smallest bucket that
        holds them (or bucket `size`): logits (R, V) float32 whose row i is prompt i's
        last token; features (T, k*H) of the padded token sequence (the prompts back to
        back from row 0) or None. Both are the graph's static outputs."""
        total = sum(len(p) for p in prompts)
        size = size or next(b for b in self.buckets if b >= total)
        buffers = self._buffers.get(size)
        if buffers is None:
            # Each query's keys end within its own prompt: the bucket bounds them.
            buffers = PrefillBuffers(size, self.num_rows, min(size, self.max_len), self.device)
            self._buffers[size] = buffers
        buffers.fill(prompts, slots, self.scratch)
        layers = tuple(feature_layers)

        def run() -> TargetOutput:
            return target(buffers.ids, buffers.meta, pool, layers, logit_rows=buffers.logit_rows)

        key = ("prefill", size, layers)
        if self.graphs.enabled and key not in self.graphs:
            # The warm-up runs really execute: they write the same K/V the replay writes.
            self.graphs.capture(key, run)
        return self.graphs.run(key, run)


def prompt_features(features: Tensor | None, lengths: Sequence[int], copy: bool
                    ) -> list[Tensor | None]:
    """features (T, k*H) of prompts laid back to back -> each prompt's (P, k*H) rows
    (copies when they are a graph's static output that the next prefill overwrites)."""
    if features is None:
        return [None] * len(lengths)
    out: list[Tensor | None] = []
    start = 0
    for n in lengths:
        part = features[start:start + n]
        out.append(part.clone() if copy else part)
        start += n
    return out
