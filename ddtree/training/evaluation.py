"""Held-out acceptance of a drafter in training, teacher-forced on the target's answers.

On a response the target generated greedily, the drafter's block at anchor `a` is exactly
what a T = 0 round would draft after committing `x[..a-1]` with bonus `x[a]`, and the
target's greedy continuation IS `x[a+1..]`. So, per block:
- linear (T = 0): 1 + the leading block positions whose argmax equals the label (exact);
- tree@N (T = 0): 1 + the depth of the deepest node of the drafter's best-N tree
  (`ddtree.tree.build_tree`) whose path spells the labels (exact);
- linear (T = 1), a lower bound: a chain of greedy drafts `d` is accepted past position k
  with probability prod_{i<=k} p(d_i | x[..a], d_<i) under sample-and-match. The target's
  distributions are known along `x` only, so the term of position k counts only where
  d_<k equals the labels (elsewhere 0): E[tau] >= 1 + sum_k prod_{i<=k} p_i(d_i) 1[d_<k = x].
Means over blocks are what `Trainer.evaluate` reports; the engine measures the real thing
(`ddtree bench`, scripts/gpu/acceptance_table.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ddtree.tree import build_tree


def chain_acceptance(correct: Tensor, keep: Tensor) -> Tensor:
    """correct, keep: (K, L) bool per block -> (K,) float32, 1 + leading correct
    positions (a block cut by the end of its sequence counts what fits)."""
    return 1.0 + (correct & keep).float().cumprod(dim=-1).sum(-1)


def tree_acceptance(draft_logits: Tensor, bonus: Tensor, labels: Tensor, budget: int) -> Tensor:
    """draft_logits: (K, L, V), bonus: (K,), labels: (K, L) (negative = no label) ->
    (K,) float32, 1 + the depth of the deepest tree node whose path equals the labels."""
    tree = build_tree(draft_logits, bonus, budget)
    num = tree.tokens.shape[1]
    on_path = torch.zeros(tree.tokens.shape, dtype=torch.bool, device=draft_logits.device)
    on_path[:, 0] = True
    label_at = labels.gather(1, (tree.depth - 1).clamp(min=0))  # (K, 1+N)
    for i in range(1, num):  # parents[:, i] < i: a parent is decided before its children
        parent_on = on_path.gather(1, tree.parents[:, i:i + 1])[:, 0]
        on_path[:, i] = parent_on & (tree.tokens[:, i] == label_at[:, i])
    return 1.0 + (tree.depth * on_path).amax(dim=1).float()


def sampled_chain_lower_bound(draft_tokens: Tensor, target_probs: Tensor, labels: Tensor,
                              keep: Tensor) -> Tensor:
    """draft_tokens, labels: (K, L) int64; target_probs: (K, L) the target's T = 1
    probability of each draft token given the labels before it; keep: (K, L) bool ->
    (K,) the lower bound on the T = 1 linear acceptance length above."""
    p = target_probs * keep
    matched = (draft_tokens == labels) & keep
    before = torch.cat([torch.ones_like(matched[:, :1]), matched[:, :-1]], dim=1)
    prefix_ok = before.float().cumprod(dim=-1)  # 1 where d_<k equals the labels
    return 1.0 + (p.cumprod(dim=-1) * prefix_ok).sum(-1)
