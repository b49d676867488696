"""The reference DDTree construction (docs/ALGORITHMS.md section 3): a best-first max-heap
over draft prefixes, one row at a time, in plain Python. Used only by tests, as the spec
that `ddtree.tree.build_tree` must reproduce node for node.

Its order is the one build_tree documents, spelled out as a heap key: higher score first,
then the shallower prefix, then (same score and depth) the prefix whose parent comes first,
then the lower token rank. Ranks within a depth order tokens by logit (the log-softmax is
monotone), ties to the lower token id. A token's log-probability is its logit minus the
depth's torch.logsumexp in float32 (0.0 for -0.0); scores are float32 sums in the same
order build_tree adds them, so both sides see bit-identical scores and exact ties.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor


@dataclass(order=True)
class _Entry:
    key: tuple
    prefix: tuple[int, ...] = field(compare=False)
    score: np.float32 = field(compare=False)
    rank: int = field(compare=False)
    parent_score: np.float32 = field(compare=False)
    parent_order: tuple = field(compare=False)


def ranked_tokens(logits: Tensor, num_ranks: int) -> list[list[int]]:
    """Per depth, the num_ranks most probable tokens (ties to the lower id). logits: (L, V)
    (or their log-softmax: the same order)."""
    rows = logits.float().tolist()
    return [sorted(range(len(row)), key=lambda t, row=row: (-row[t], t))[:num_ranks]
            for row in rows]


def heap_tree(
    logits: Tensor, budget: int, max_topk: int | None = None
) -> list[tuple[tuple[int, ...], float]]:
    """The `budget` best prefixes of the draft logits (L, V), in pop order.

    Returns (prefix tokens, float32 score) per node. Pops the best prefix, then pushes its
    next sibling (same parent, next rank) and its first child (next depth, rank 0).
    """
    num_levels, vocab = logits.shape
    num_ranks = min(budget, vocab, max_topk or budget)
    ranked = ranked_tokens(logits, num_ranks)
    logp = logits.float() - torch.logsumexp(logits.float(), dim=-1, keepdim=True)
    table = np.asarray(torch.where(logp == 0, 0.0, logp).numpy(), dtype=np.float32)
    heap: list[_Entry] = []

    def push(prefix: tuple[int, ...], rank: int, parent_score: np.float32,
             parent_order: tuple) -> None:
        depth = len(prefix) + 1
        token = ranked[depth - 1][rank]
        score = np.float32(parent_score + table[depth - 1, token])
        order = (-float(score), parent_order, rank)  # the order among prefixes of one depth
        heapq.heappush(heap, _Entry((-float(score), depth, order), (*prefix, token), score,
                                    rank, parent_score, parent_order))

    push((), 0, np.float32(0.0), ())
    popped: list[tuple[tuple[int, ...], float]] = []
    while heap and len(popped) < budget:
        entry = heapq.heappop(heap)
        popped.append((entry.prefix, float(entry.score)))
        if entry.rank + 1 < num_ranks:
            push(entry.prefix[:-1], entry.rank + 1, entry.parent_score, entry.parent_order)
        if len(entry.prefix) < num_levels:
            push(entry.prefix, 0, entry.score, entry.key[2])
    return popped
