"""The walk: which path of a verified draft tree the target accepts, and the next bonus
token (docs/ALGORITHMS.md sections 3 and 4), for a batch whose rows each have their own
sampling parameters and their own mode (the linear rule or the full tree).

Greedy (temperature 0): from the root, move to the child whose token is the target's argmax
at the current node, while one exists. Sampled: the target-only tree rule, lossless without
draft probabilities: at a node with target distribution p, try its children in index order
and accept child c with probability p(c) / (1 - mass of the distinct tokens already
rejected); if all are rejected, sample the bonus from p with the children's tokens removed.

Every node's accept / reject outcome depends only on its parent's distribution, so all of
them are drawn at once, before the walk; the walk itself is D gathers. Random numbers come
from `counter_uniform` (request seed, committed length), so a request's draws do not
depend on its batch. No host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree.sampling import (
    STREAM_ACCEPT,
    STREAM_BONUS,
    RowSampling,
    counter_uniform,
    row_target_probs,
)
from ddtree.tree import DraftTree, ancestor_chains


@dataclass(frozen=True, eq=False)
class WalkResult:
    """path: (B, D+1) node indices of the accepted path, root first, 0-padded beyond
    acceptance_length; acceptance_length: (B,) int64 nodes on the path incl. the root (>= 1);
    next_token: (B,) int64 the new bonus, the target's token at the path's last node."""

    path: Tensor
    acceptance_length: Tensor
    next_token: Tensor


def walk(
    tree: DraftTree, logits: Tensor, rows: RowSampling, counter: Tensor,
    first_child_only: Tensor, max_depth: int, chains: Tensor | None = None,
) -> WalkResult:
    """Walks `tree` with the target's logits (B, 1+N, V) at every node.

    rows: each row's sampling parameters; counter: (B,) int64, a value the row never uses
    twice (its committed length); first_child_only: (B,) bool, the linear rule on the
    rank-0 chain (each node's lowest-index child only; linear and shadow rows);
    max_depth: at most this many steps (D); chains: the tree's (B, 1+N, D+1)
    `ancestor_chains`, when the caller has them. Padding nodes (`tree.valid` False) are
    never accepted and never count as rejected children.
    """
    batch, num_rows, _ = logits.shape
    assert tree.tokens.shape == (batch, num_rows), "logits must have one row per tree node"
    considered = _considered_children(tree, first_child_only)  # (B, 1+N)
    choice = logits.argmax(dim=-1)  # (B, 1+N): the target's greedy token at each node
    greedy_accepted = considered & (tree.tokens == choice.gather(1, tree.parents.clamp(min=0)))
    if not rows.any_sampled:
        path, length, last, _ = _follow(tree.parents, tree.depth, greedy_accepted, max_depth,
                                        chains)
        return WalkResult(path, length, choice.gather(1, last[:, None])[:, 0])
    probs = row_target_probs(logits, rows)  # (B, 1+N, V)
    uniform = counter_uniform(rows.seed, counter, STREAM_ACCEPT, num_rows)  # (B, 1+N)
    sampled_accepted = _draw_acceptance(tree, probs, considered, uniform)
    greedy = rows.is_greedy[:, None]
    accepted = torch.where(greedy, greedy_accepted, sampled_accepted)
    path, length, last, at_limit = _follow(tree.parents, tree.depth, accepted, max_depth, chains)
    race = counter_uniform(rows.seed, counter, STREAM_BONUS, probs.shape[-1])  # (B, V)
    sampled_next = _draw_bonus(tree, probs, considered, last, at_limit, race)
    next_token = torch.where(rows.is_greedy, choice.gather(1, last[:, None])[:, 0], sampled_next)
    return WalkResult(path, length, next_token)


def _considered_children(tree: DraftTree, first_child_only: Tensor) -> Tensor:
    """(B, 1+N) bool: the nodes the walk may move to from their parent."""
    parents = tree.parents
    batch, num_rows = parents.shape
    is_child = parents >= 0
    if tree.valid is not None:
        is_child = is_child & tree.valid
    index = torch.arange(num_rows, device=parents.device).expand(batch, num_rows)
    # first[b, p] = lowest-index child of p (num_rows = none); column num_rows absorbs the root.
    first = torch.full((batch, num_rows + 1), num_rows, device=parents.device)
    first.scatter_reduce_(1, torch.where(is_child, parents, num_rows), index, reduce="amin")
    is_first = first.gather(1, parents.clamp(min=0)) == index
    return is_child & (is_first | ~first_child_only[:, None])


def _follow(
    parents: Tensor, depth: Tensor, accepted: Tensor, steps: int, chains: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """From the root, move to the lowest-index accepted child, at most `steps` times.
    depth: (B, 1+N) of each node; chains: (B, 1+N, steps+1) `ancestor_chains` (computed
    here when None; the engine passes the ones its attention metadata already holds).

    Returns path (B, steps+1), acceptance_length (B,), the last node (B,) and whether the
    walk was still moving when it ran out of steps (B,) bool. No loop over the steps: a
    node is on the path iff it and each of its ancestors below the root is its parent's
    chosen child (the lowest-index accepted one), read along its ancestor chain at once.
    """
    batch, num_rows = parents.shape
    device = parents.device
    index = torch.arange(num_rows, device=device).expand(batch, num_rows)
    # next_child[b, p] = lowest-index accepted child of p, num_rows when there is none.
    next_child = torch.full((batch, num_rows + 1), num_rows, device=device)
    next_child.scatter_reduce_(1, torch.where(accepted, parents, num_rows), index, reduce="amin")
    chosen = accepted & (next_child.gather(1, parents.clamp(min=0)) == index)  # (B, 1+N)
    if chains is None:
        _, chains = ancestor_chains(parents, steps + 1)  # (B, 1+N, steps+1)
    levels = torch.arange(steps + 1, device=device)
    below = (levels[None, None, :] >= 1) & (levels[None, None, :] <= depth[:, :, None])
    chosen_chain = chosen.gather(1, chains.reshape(batch, -1)).view_as(chains)
    on_path = ((chosen_chain | ~below).all(dim=-1) & (depth <= steps)) | (index == 0)
    path = torch.zeros(batch, steps + 2, dtype=torch.long, device=device)  # +1 absorbs
    path.scatter_(1, torch.where(on_path, depth, steps + 1), index)
    path = path[:, : steps + 1]
    length = on_path.sum(dim=1)
    last = path.gather(1, (length - 1)[:, None])[:, 0]
    return path, length, last, length - 1 == steps  # out of steps: children never tried


def _draw_acceptance(tree: DraftTree, probs: Tensor, considered: Tensor,
                     uniform: Tensor) -> Tensor:
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
    return uniform < accept


def _draw_bonus(tree: DraftTree, probs: Tensor, considered: Tensor, last: Tensor,
                at_limit: Tensor, race: Tensor) -> Tensor:
    """(B,) the next bonus token: a sample from p at the last node with the tokens of its
    rejected children removed. When the walk stopped at max_depth its children were never
    tried, so nothing is removed. race: (B, V) uniforms."""
    batch, _, vocab = probs.shape
    dist = probs.gather(1, last[:, None, None].expand(batch, 1, vocab))[:, 0]  # (B, V)
    rejected = considered & (tree.parents == last[:, None]) & ~at_limit[:, None]  # (B, 1+N)
    removed = torch.zeros_like(dist).scatter_add_(1, tree.tokens, rejected.float())
    residual = dist.masked_fill(removed > 0, 0.0)
    # All mass removed only through rounding (the children held ~all of it): keep p then.
    residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, dist)
    return sample_race(residual, race)


def sample_race(weights: Tensor, uniform: Tensor) -> Tensor:
    """(B,) index i with probability weights[b, i] / sum_i weights[b, i], from uniforms
    (B, V) in (0, 1): the exponential race argmax w_i / E_i, E_i = -log u_i ~ Exp(1)."""
    return (weights / -torch.log(uniform)).argmax(dim=-1)
