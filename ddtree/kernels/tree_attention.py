"""Tree attention over the KV pool: every query attends to its row's committed prefix
(read straight from the pool, no mask) followed by its own tree keys (its ancestors and
itself, in depth order), in LOGICAL POSITION ORDER.

The logical key sequence of query t has `prefix_len[t] + num_tree_keys[t]` entries;
entry p lives in pool row `query_slot[t]` at slot

    p                                              if p < prefix_len[t]
    tree_base[t] + tree_keys[t, p - prefix_len[t]] otherwise

Queries of every kind use this one description:
- ar step at committed length n (its own K/V already written at slot n):
  prefix_len = n + 1, num_tree_keys = 0;
- chain / tree verify at committed length n (node j's K/V written at slot n + j):
  prefix_len = n, tree_base = n, tree_keys = the node's ancestor chain root first, ending
  with the node itself (depth + 1 entries);
- causal prefill of M tokens after n committed: prefix_len = n + m + 1, no tree keys;
- the drafter's block (bidirectional): prefix_len = context length c, tree_base = c,
  tree_keys = 0..b-1 for every block query.

Batch invariance (the contract the Triton kernel must keep, bitwise): the output of query
t depends only on q[t] and the VALUES of its logical key sequence - not on T, not on the
other queries, not on how the sequence splits between prefix and tree keys, not on
`max_kv_len` or the pool row. Keys are reduced in blocks of fixed size over logical
positions [0, B), [B, 2B), ... and, for long contexts, in splits of a fixed number of
logical positions combined in split order. So a tree node's logits equal those of the
ar step that would have produced the same token.
"""

from __future__ import annotations

import torch
from torch import Tensor


def logical_slots(
    prefix_len: Tensor, tree_base: Tensor, tree_keys: Tensor, num_tree_keys: Tensor,
    length: int,
) -> tuple[Tensor, Tensor]:
    """The pool slot of each logical key position, and whether the position exists.

    prefix_len, tree_base, num_tree_keys: (T,) int; tree_keys: (T, Kt) int.
    Returns slots (T, length) int64 (0 where invalid) and valid (T, length) bool.
    """
    positions = torch.arange(length, device=prefix_len.device)[None, :]  # (1, P)
    prefix = prefix_len.long()[:, None]  # (T, 1)
    total = prefix + num_tree_keys.long()[:, None]  # (T, 1)
    if tree_keys.shape[1] == 0:
        tree_slot = torch.zeros_like(positions).expand(prefix.shape[0], length)
    else:
        index = (positions - prefix).clamp(0, tree_keys.shape[1] - 1)  # (T, P)
        tree_slot = tree_base.long()[:, None] + tree_keys.long().gather(1, index)
    slots = torch.where(positions < prefix, positions, tree_slot)  # (T, P)
    valid = positions < total
    return torch.where(valid, slots, 0), valid


def tree_attention_reference(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, query_slot: Tensor, prefix_len: Tensor,
    tree_base: Tensor, tree_keys: Tensor, num_tree_keys: Tensor, scale: float,
    compute_dtype: torch.dtype = torch.float32, length: int | None = None,
) -> Tensor:
    """Plain PyTorch: gathers each query's logical keys, softmax in `compute_dtype`.

    q: (T, Hq, D); k_cache, v_cache: (num_slots, max_len, Hkv, D) (one layer of the pool);
    query_slot, prefix_len, tree_base, num_tree_keys: (T,) int; tree_keys: (T, Kt) int.
    Every query must have at least one key. Returns (T, Hq, D) in q's dtype. `length`
    bounds the keys per query; None reads the longest from the tensors (a host sync).
    """
    num_queries, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if length is None:
        length = int((prefix_len.long() + num_tree_keys.long()).max())
    slots, valid = logical_slots(prefix_len, tree_base, tree_keys, num_tree_keys, length)
    rows = query_slot.long()[:, None].expand(num_queries, length)  # (T, P)
    keys = k_cache[rows, slots].to(compute_dtype)  # (T, P, Hkv, D)
    values = v_cache[rows, slots].to(compute_dtype)  # (T, P, Hkv, D)
    group = num_heads // num_kv_heads
    queries = q.to(compute_dtype).view(num_queries, num_kv_heads, group, head_dim)
    scores = torch.einsum("tkgd,tpkd->tkgp", queries, keys) * scale  # (T, Hkv, G, P)
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("tkgp,tpkd->tkgd", probs, values)  # (T, Hkv, G, D)
    return out.reshape(num_queries, num_heads, head_dim).to(q.dtype)
