"""What the queries of one forward see in the KV pool: `AttentionMeta`, one entry per
query token (flattened over the batch, T = B * M), in the logical-key form of
ddtree/kernels/tree_attention.py.

Builders for the three shapes of work: a tree (or chain, or single root) per row at its
committed length, a causal chunk of one row (prefill), and the drafter's bidirectional
block. All of them run on the device without a host sync, so they can be captured in a
CUDA graph; only `max_kv_len` is a Python int (it sizes the attention grid).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree.tree import ancestor_chains


@dataclass(frozen=True, eq=False)
class AttentionMeta:
    """Per query token, flattened (T,) unless said: `write_slot`/`write_pos` where its own
    K/V go; `query_slot` its pool row; `prefix_len`, `tree_base`, `tree_keys` (T, Kt),
    `num_tree_keys` its logical key sequence; `positions` its RoPE position (int64).
    `max_kv_len` bounds prefix_len + num_tree_keys (a Python int, sizes the grid).
    `queries_per_row` (a Python int): 1 where every query has a pool row of its own
    (decoding), so tree attention's query groups cannot form and the launch runs the
    kernel without them; 0 where rows may hold several consecutive queries."""

    positions: Tensor
    write_slot: Tensor
    write_pos: Tensor
    query_slot: Tensor
    prefix_len: Tensor
    tree_base: Tensor
    tree_keys: Tensor
    num_tree_keys: Tensor
    max_kv_len: int
    queries_per_row: int = 0

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]


def tree_meta(slots: Tensor, committed: Tensor, parents: Tensor, depth: Tensor,
              width: int, max_kv_len: int, chains: Tensor | None = None) -> AttentionMeta:
    """Rows of trees verified at their committed lengths.

    slots, committed: (B,) int64 pool row and committed length; parents, depth: (B, M).
    Node j of row b writes its K/V at slot committed[b] + j, is encoded at position
    committed[b] + depth[b, j], and attends to the committed prefix then its ancestor
    chain. `width` = max depth + 1 (the block size for drafted trees); chains: the
    trees' `ancestor_chains` (B, M, width) when the caller has them."""
    batch, num_nodes = parents.shape
    index = torch.arange(num_nodes, device=slots.device)
    base = committed[:, None].expand(batch, num_nodes)  # (B, M)
    if chains is None:
        _, chains = ancestor_chains(parents, width)  # (B, M, width)
    rows = _flat(slots[:, None].expand(batch, num_nodes))
    return AttentionMeta(
        positions=_flat(base + depth), write_slot=rows, write_pos=_flat(base + index),
        query_slot=rows, prefix_len=_flat(base), tree_base=_flat(base),
        tree_keys=chains.reshape(batch * num_nodes, width).contiguous(),
        num_tree_keys=_flat(depth + 1), max_kv_len=max_kv_len,
        queries_per_row=1 if num_nodes == 1 else 0,
    )


def _flat(x: Tensor) -> Tensor:
    """(B, M) -> (B*M,) contiguous (a view of an expanded tensor may have stride 0)."""
    return x.reshape(-1).contiguous()


def causal_meta(slot: int, start: int, num_tokens: int, device: torch.device) -> AttentionMeta:
    """`num_tokens` new tokens of pool row `slot` at positions start .. start+num-1, each
    seeing every earlier slot of its row and itself (prefill, or one prefill chunk)."""
    positions = torch.arange(start, start + num_tokens, device=device)
    rows = torch.full((num_tokens,), slot, dtype=torch.long, device=device)
    zeros = torch.zeros(num_tokens, dtype=torch.long, device=device)
    return AttentionMeta(
        positions=positions, write_slot=rows, write_pos=positions, query_slot=rows,
        prefix_len=positions + 1, tree_base=zeros, tree_keys=zeros[:, None],
        num_tree_keys=zeros, max_kv_len=start + num_tokens,
    )


def device_ints(values: Sequence[int], device: torch.device) -> Tensor:
    """Host integers as an int64 tensor on `device`, without a host sync
    (`torch.tensor(values, device=...)` is a blocking copy: it waits for every kernel
    already enqueued, the round in flight too, lease 18). The pageable source is staged
    before the call returns, so it may be freed at once."""
    return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)


def prompts_meta(slots: list[int], lengths: list[int], device: torch.device) -> AttentionMeta:
    """Several rows' prompts in one forward: row i's `lengths[i]` tokens at positions 0 ..
    lengths[i]-1 of pool row `slots[i]`, each causal within its own row (batched prefill).
    Every token's keys and arithmetic are those of its row's prefill alone."""
    count = device_ints(lengths, device)
    rows = torch.repeat_interleave(device_ints(slots, device), count)
    starts = torch.repeat_interleave(torch.cumsum(count, 0) - count, count)
    positions = torch.arange(rows.shape[0], device=device) - starts
    zeros = torch.zeros_like(positions)
    return AttentionMeta(
        positions=positions, write_slot=rows, write_pos=positions, query_slot=rows,
        prefix_len=positions + 1, tree_base=zeros, tree_keys=zeros[:, None],
        num_tree_keys=zeros, max_kv_len=max(lengths),
    )


def block_meta(slots: Tensor, context_len: Tensor, block_size: int,
               max_kv_len: int) -> AttentionMeta:
    """The drafter's blocks: row b's block of `block_size` queries sits at positions
    context_len[b] + j, writes its K/V there (scratch past the context) and sees the whole
    context plus the whole block (bidirectional)."""
    batch = slots.shape[0]
    index = torch.arange(block_size, device=slots.device)
    base = context_len[:, None].expand(batch, block_size)  # (B, b)
    rows = _flat(slots[:, None].expand(batch, block_size))
    return AttentionMeta(
        positions=_flat(base + index), write_slot=rows,
        write_pos=_flat(base + index), query_slot=rows, prefix_len=_flat(base),
        tree_base=_flat(base),
        tree_keys=index.expand(batch * block_size, block_size).contiguous(),
        num_tree_keys=torch.full((batch * block_size,), block_size, dtype=torch.long,
                                 device=slots.device),
        max_kv_len=max_kv_len,
    )


def context_meta(slots: Tensor, start: Tensor, num_new: int, keep: Tensor | None = None,
                 scratch: int | None = None) -> AttentionMeta:
    """Where the drafter's new context rows go: row b's j-th at position and slot
    start[b] + j of pool row slots[b]; with `keep` (B,), rows j >= keep[b] go to pool row
    `scratch` instead (at the same positions: never read). (They are stored, not
    attended: the attention fields are empty.)"""
    batch = slots.shape[0]
    index = torch.arange(num_new, device=slots.device)
    positions = _flat(start[:, None] + index)
    rows = slots[:, None].expand(batch, num_new)
    if keep is not None:
        assert scratch is not None, "rows past `keep` go to the scratch row"
        rows = torch.where(index[None, :] < keep[:, None], rows, scratch)
    zeros = torch.zeros_like(positions)
    return AttentionMeta(
        positions=positions, write_slot=_flat(rows), write_pos=positions,
        query_slot=_flat(rows), prefix_len=zeros, tree_base=zeros, tree_keys=zeros[:, None],
        num_tree_keys=zeros, max_kv_len=0,
    )


def stored_rows(first: AttentionMeta, second: AttentionMeta) -> AttentionMeta:
    """Where the rows of two metas go, the first's then the second's, for one store of
    both (`positions`, `write_slot`, `write_pos`; the attention fields are empty)."""
    positions = torch.cat([first.positions, second.positions])
    zeros = torch.zeros_like(positions)
    return AttentionMeta(
        positions=positions, write_slot=torch.cat([first.write_slot, second.write_slot]),
        write_pos=torch.cat([first.write_pos, second.write_pos]), query_slot=zeros,
        prefix_len=zeros, tree_base=zeros, tree_keys=zeros[:, None], num_tree_keys=zeros,
        max_kv_len=0,
    )


def prologue_metas(positions: Tensor, write_slot: Tensor, prefix: Tensor, block_size: int,
                   max_kv_len: int) -> tuple[AttentionMeta, AttentionMeta]:
    """`block_meta` and `stored_rows(context rows, block)` over the fields of
    `ddtree.kernels.draft_prologue.block_inputs` (positions and write slots (2T,): the T
    context rows then the T block rows; prefix (T,)): the same tensors' values, the
    shape-only fields (every block query's keys 0..b-1, b of them) cached per shape."""
    num_tokens = prefix.shape[0]
    tree_keys, num_keys, zeros = _block_constants(num_tokens, block_size, prefix.device)
    block = AttentionMeta(
        positions=positions[num_tokens:], write_slot=write_slot[num_tokens:],
        write_pos=positions[num_tokens:], query_slot=write_slot[num_tokens:],
        prefix_len=prefix, tree_base=prefix, tree_keys=tree_keys, num_tree_keys=num_keys,
        max_kv_len=max_kv_len)
    stored = AttentionMeta(
        positions=positions, write_slot=write_slot, write_pos=positions, query_slot=zeros,
        prefix_len=zeros, tree_base=zeros, tree_keys=zeros[:, None], num_tree_keys=zeros,
        max_kv_len=0)
    return block, stored


@functools.cache  # never evicted: captured graphs read these tensors
def _block_constants(num_tokens: int, block_size: int,
                     device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """(T, b) keys 0..b-1 of every block query, (T,) b, (2T,) zeros: shapes only, built
    eagerly (graphs warm up before they capture) and cached."""
    index = torch.arange(block_size, device=device)
    return (index.expand(num_tokens, block_size).contiguous(),
            torch.full((num_tokens,), block_size, dtype=torch.long, device=device),
            torch.zeros(2 * num_tokens, dtype=torch.long, device=device))
