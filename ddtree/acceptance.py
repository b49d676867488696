"""The walk: which path of a verified draft tree the target accepts, and the next bonus
token (docs/ALGORITHMS.md sections 3 and 4).

Greedy (temperature 0): from the root, move to the child whose token is the target's argmax
at the current node, while one exists. Sampled: the target-only tree rule, lossless without
draft probabilities: at a node with target distribution p, try its children in index order
and accept child c with probability p(c) / (1 - mass of the distinct tokens already
rejected); if all are rejected, sample the bonus from p with the children's tokens removed.

Every node's accept / reject outcome depends only on its parent's distribution, so all of
them are drawn at once, before the walk; the walk itself is D gathers. No host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree.sampling import SamplingParams, target_probs
from ddtree.tree import DraftTree


@dataclass(frozen=True, eq=False)
class WalkResult:
    """path: (B, D+1) node indices of the accepted path, root first, 0-padded beyond
    acceptance_length; acceptance_length: (B,) int64 nodes on the path incl. the root (>= 1);
    next_token: (B,) int64 the new bonus, the target's token at the path's last node."""

    path: Tensor
    acceptance_length: Tensor
    next_token: Tensor


def walk(
    tree: DraftTree, logits: Tensor, params: SamplingParams,
    generator: torch.Generator | None = None, first_child_only: bool = False,
    max_depth: int | None = None,
) -> WalkResult:
    """Walks `tree` with the target's logits (B, 1+N, V) at every node.

    first_child_only: consider only each node's lowest-index (rank-0) child, i.e. the
    linear rule on the rank-0 chain (shadow and linear modes). max_depth: at most this many
    steps (D; None = N). Uses `generator` (on the logits' device) for every random draw.
    """
    batch, num_rows, _ = logits.shape
    assert tree.tokens.shape == (batch, num_rows), "logits must have one row per tree node"
    steps = num_rows - 1 if max_depth is None else max_depth
    considered = _considered_children(tree.parents, first_child_only)  # (B, 1+N)
    if params.is_greedy:
        choice = logits.argmax(dim=-1)  # (B, 1+N): the target's token at each node
        accepted = considered & (tree.tokens == choice.gather(1, tree.parents.clamp(min=0)))
        path, length, last, _ = _follow(tree.parents, accepted, steps)
        return WalkResult(path, length, choice.gather(1, last[:, None])[:, 0])
    probs = target_probs(logits, params)  # (B, 1+N, V)
    accepted = _draw_acceptance(tree, probs, considered, generator)
    path, length, last, at_limit = _follow(tree.parents, accepted, steps)
    return WalkResult(path, length, _draw_bonus(tree, probs, considered, last, at_limit,
                                                generator))


def _considered_children(parents: Tensor, first_child_only: bool) -> Tensor:
    """(B, 1+N) bool: the nodes the walk may move to from their parent."""
    batch, num_rows = parents.shape
    is_child = parents >= 0
    if not first_child_only:
        return is_child
    index = torch.arange(num_rows, device=parents.device).expand(batch, num_rows)
    # first[b, p] = lowest-index child of p (num_rows = none); column num_rows absorbs the root.
    first = torch.full((batch, num_rows + 1), num_rows, device=parents.device)
    first.scatter_reduce_(1, torch.where(is_child, parents, num_rows), index, reduce="amin")
    return is_child & (first.gather(1, parents.clamp(min=0)) == index)


def _follow(
    parents: Tensor, accepted: Tensor, steps: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """From the root, move to the lowest-index accepted child, at most `steps` times.

    Returns path (B, steps+1), acceptance_length (B,), the last node (B,) and whether the
    walk was still moving when it ran out of steps (B,) bool.
    """
    batch, num_rows = parents.shape
    index = torch.arange(num_rows, device=parents.device).expand(batch, num_rows)
    # next_child[b, p] = lowest-index accepted child of p, num_rows when there is none.
    next_child = torch.full((batch, num_rows + 1), num_rows, device=parents.device)
    next_child.scatter_reduce_(1, torch.where(accepted, parents, num_rows), index, reduce="amin")
    node = torch.zeros(batch, dtype=torch.long, device=parents.device)
    moving = torch.ones(batch, dtype=torch.bool, device=parents.device)
    path, length = [node], torch.ones_like(node)
    for _ in range(steps):
        child = next_child.gather(1, node[:, None])[:, 0]  # (B,)
        moving = moving & (child < num_rows)
        node = torch.where(moving, child, node)
        path.append(torch.where(moving, child, 0))
        length = length + moving.long()
    return torch.stack(path, dim=1), length, node, moving


def _draw_acceptance(
    tree: DraftTree, probs: Tensor, considered: Tensor, generator: torch.Generator | None
) -> Tensor:
    """(B, 1+N) bool: would node c be accepted once the walk stands at its parent and its
    earlier siblings were rejected? P = p(c) / (1 - mass of earlier distinct siblings), with
    p the parent's target distribution; 0 for a token an earlier sibling already had."""
    batch, num_rows, vocab = probs.shape
    parents, tokens = tree.parents, tree.tokens
    index = torch.arange(num_rows, device=probs.device)
    # p_parent(c)(token(c)) for every node, read from the flattened (B, (1+N)*V) table.
    mass = probs.reshape(batch, -1).gather(1, parents.clamp(min=0) * vocab + tokens)  # (B, 1+N)
    earlier = (considered[:, :, None] & considered[:, None, :]
               & (parents[:, :, None] == parents[:, None, :])
               & (index[:, None] < index[None, :]))  # [b, j, c]: j is an earlier sibling of c
    repeat = (earlier & (tokens[:, :, None] == tokens[:, None, :])).any(dim=1)  # (B, 1+N)
    rejected_mass = ((earlier & ~repeat[:, :, None]) * mass[:, :, None]).sum(dim=1)
    # Rounding can push the denominator to 0 only when earlier siblings hold all the mass,
    # and then one of them is accepted with certainty: any probability here is unreachable.
    accept = (mass / (1 - rejected_mass).clamp(min=1e-30)).clamp(max=1.0)
    accept = torch.where(considered & ~repeat, accept, 0.0)
    uniform = torch.rand(batch, num_rows, generator=generator, device=probs.device)
    return uniform < accept


def _draw_bonus(
    tree: DraftTree, probs: Tensor, considered: Tensor, last: Tensor, at_limit: Tensor,
    generator: torch.Generator | None,
) -> Tensor:
    """(B,) the next bonus token: a sample from p at the last node with the tokens of its
    rejected children removed. When the walk stopped at max_depth its children were never
    tried, so nothing is removed."""
    batch, _, vocab = probs.shape
    dist = probs.gather(1, last[:, None, None].expand(batch, 1, vocab))[:, 0]  # (B, V)
    rejected = considered & (tree.parents == last[:, None]) & ~at_limit[:, None]  # (B, 1+N)
    removed = torch.zeros_like(dist).scatter_add_(1, tree.tokens, rejected.float())
    residual = dist.masked_fill(removed > 0, 0.0)
    # All mass removed only through rounding (the children held ~all of it): keep p then.
    residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, dist)
    # Exponential race: argmax r_i / E_i with E_i ~ Exp(1) picks i with probability r_i / sum r.
    race = torch.empty_like(residual).exponential_(generator=generator).clamp_(min=1e-30)
    return (residual / race).argmax(dim=-1)
