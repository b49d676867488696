"""Draft trees (docs/ALGORITHMS.md section 3): the DDTree construction, the linear chain,
the ancestor-only attention mask, and the validation of trees that come over the wire.

`build_tree` returns the `budget` most probable draft prefixes without a heap and without a
host sync: a beam over depths (at most `N - d + 1` prefixes at depth d: `_beam_widths`), then
one top-`N` over the union of all depths.
Every shape depends only on (B, L, V, N, max_topk), so the function can be captured in a
CUDA graph. tests/unit/heap_reference.py holds the best-first heap it must agree with.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree.errors import InvalidArgumentError
from ddtree.kernels import tree_build, vocab_topk

_INTEGER_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


@dataclass(frozen=True, eq=False)
class DraftTree:
    """A batch of draft trees; node 0 is the root (the bonus token).

    tokens, parents, depth: (B, 1+N) int64 with parents[:, 0] = -1, depth[:, 0] = 0 and
    parents[b, i] < i. Children of a node appear by decreasing draft probability, so its
    lowest-index child is its rank-0 child.
    scores: (B, 1+N) float32 draft log-probability of each node's prefix (root 0), or None
    when the tree was not built here (a chain, a tree from the wire).
    valid: (B, 1+N) bool, False for the padding nodes of a row whose tree is smaller than
    the batch's node count (they are verified like any node but never accepted); None =
    every node is real.
    """

    tokens: Tensor
    parents: Tensor
    depth: Tensor
    scores: Tensor | None = None
    valid: Tensor | None = None

    @property
    def num_nodes(self) -> int:
        """N: the number of nodes besides the root."""
        return self.tokens.shape[1] - 1


# ---------------------------------------------------------------------------- DDTree


def build_tree(
    draft_logits: Tensor, bonus: Tensor, budget: int, max_topk: int | None = None
) -> DraftTree:
    """The `budget` most probable prefixes under the drafter's factorised distribution.

    draft_logits: (B, L, V) logits of draft positions 1..L; bonus: (B,) root tokens.
    Returns N = budget nodes per row, ordered by decreasing prefix log-probability; ties go
    to the shallower prefix (a child whose token has probability 1 ties its parent), then to
    the earlier beam position. Only the top K = min(N, V, max_topk) tokens of each depth are
    used. No host sync; raises InvalidArgumentError when the budget cannot be met.
    """
    batch, num_levels, vocab = draft_logits.shape
    assert bonus.shape == (batch,), f"bonus {tuple(bonus.shape)}, expected ({batch},)"
    num_ranks = _check_budget(budget, max_topk, num_levels, vocab)
    logits = draft_logits.float()
    rank_tokens, lse = _ranks(logits, num_ranks, kernel=False)  # (B, L, K), (B, L)
    rank_logp = rank_log_probs(logits, rank_tokens, lse)  # (B, L, K)
    widths = _beam_widths(budget, num_ranks, num_levels)
    scores, tokens, parents, depth = _beam_union(rank_logp, rank_tokens, widths)  # (B, U) ...
    node_scores, pick = _top_sorted(scores, budget)  # (B, N): by score, depth, beam position
    return _assemble(bonus, pick, node_scores, tokens, parents, depth)


def build_round_tree(
    draft_logits: Tensor, bonus: Tensor, num_nodes: int, budget: Tensor,
    force_chain: Tensor, max_topk: Tensor, kernels: bool = False,
    topk_kernel: bool | None = None, out: DraftTree | None = None,
) -> DraftTree:
    """One round's trees for a batch whose rows differ in mode and budget, in one static
    shape (B, 1 + num_nodes), no host sync.

    draft_logits: (B, L, V); bonus: (B,); budget: (B,) int64 real nodes of each row (0 = the
    root alone, an ar row); force_chain: (B,) bool, the rank-0 chain of the block comes
    first (its depth order), the rest by score (linear rows: budget L; shadow rows: budget
    >= L; integers, nonzero = True, are taken too); max_topk: (B,) int64 branching cap
    per depth, 0 = none. `out`: a tree of this shape (with `valid`) whose tensors receive
    the result (a round's buffers; the tree build kernel writes them directly, no copy).
    Row b's first budget[b]
    nodes are exactly `build_tree(..., budget[b], max_topk[b])`'s nodes (or the chain plus
    the best others); nodes past them are padding (`valid` False, parent the root).
    Requires num_nodes >= budget[b] and, where force_chain, budget[b] >= L.
    The tree needs each depth's top-K tokens and their log-probabilities alone (logit -
    log-sum-exp: `rank_log_probs`), never the (B, L, V) log-softmax. With `kernels` the
    vocabulary's top-K and the log-sum-exp run in the same few Triton kernels
    (`ddtree.kernels.vocab_topk`; `topk_kernel` False keeps torch.topk and
    torch.logsumexp) and everything after them in one (`ddtree.kernels.tree_build`): the
    same trees as the PyTorch path over the same log-sum-exp, bitwise (the kernels' own
    log-sum-exp agrees with torch's to float32 rounding)."""
    batch, num_levels, vocab = draft_logits.shape
    num_ranks = min(num_nodes, vocab)
    logits = draft_logits.float()
    rank_tokens, lse = _ranks(logits, num_ranks,  # (B, L, K), (B, L)
                              kernel=kernels if topk_kernel is None else topk_kernel)
    widths = _beam_widths(num_nodes, num_ranks, num_levels)
    if kernels and tree_build.supports(num_nodes, num_ranks, widths):
        into = None
        if out is not None:
            assert out.valid is not None, "out needs `valid`"
            into = (out.tokens, out.parents, out.depth, out.valid)
        tokens, parents, depth, valid, scores = tree_build.tree_from_ranks(
            logits, lse, rank_tokens, bonus, widths, num_nodes, budget, force_chain, max_topk,
            out=into)
        return DraftTree(tokens, parents, depth, scores=scores, valid=valid)
    force_chain = force_chain.bool()
    device = logits.device
    rank = torch.arange(num_ranks, device=device)
    capped = (max_topk[:, None] > 0) & (rank[None, :] >= max_topk[:, None])  # (B, K)
    rank_logp = rank_log_probs(logits, rank_tokens, lse).masked_fill(capped[:, None, :],
                                                                     float("-inf"))
    scores, tokens, parents, depth = _beam_union(rank_logp, rank_tokens, widths)  # (B, U)
    order = scores.sort(dim=-1, descending=True, stable=True).indices  # (B, U)
    # The chain's entry of each depth is the first of its beam (the best prefix of a
    # factorised distribution takes the top token at every depth).
    is_chain = _chain_entries(widths, device)  # (U,)
    first = (force_chain[:, None] & is_chain[None, :]).gather(1, order)  # (B, U)
    order = order.gather(1, first.byte().sort(dim=-1, descending=True, stable=True).indices)
    pick = order[:, :num_nodes]  # (B, N)
    tree = _assemble(bonus, pick, scores.gather(1, pick), tokens, parents, depth)
    index = torch.arange(1, num_nodes + 1, device=device)
    assert tree.scores is not None
    real = (index[None, :] <= budget[:, None]) & (tree.scores[:, 1:] > float("-inf"))
    valid = torch.cat([torch.ones_like(real[:, :1]), real], dim=1)  # (B, 1+N)
    zero = torch.zeros_like(tree.tokens)
    built = DraftTree(
        tokens=torch.where(valid, tree.tokens, zero),
        parents=torch.where(valid, tree.parents, zero),
        depth=torch.where(valid, tree.depth, zero + 1),
        scores=tree.scores, valid=valid,
    )
    if out is None:
        return built
    assert out.valid is not None
    for dest, value in ((out.tokens, built.tokens), (out.parents, built.parents),
                        (out.depth, built.depth), (out.valid, valid)):
        dest.copy_(value)
    return DraftTree(out.tokens, out.parents, out.depth, scores=built.scores, valid=out.valid)


@functools.lru_cache(maxsize=256)
def _chain_entries(widths: tuple[int, ...], device: torch.device) -> Tensor:
    """(U,) bool: the first union entry of every depth."""
    flags = [torch.arange(width, device=device) == 0 for width in widths]
    return torch.cat(flags)


def _beam_union(
    rank_logp: Tensor, rank_tokens: Tensor, widths: tuple[int, ...]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The beams of all depths, concatenated depth-major (the "union", U = sum of widths).

    rank_logp, rank_tokens: (B, L, K). Returns per union entry its score (B, U), token
    (B, U), parent's union index (B, U; depth-1 entries point at the extra index U, which
    stands for the root) and depth (U,).
    """
    scores = torch.zeros(rank_logp.shape[0], 1, device=rank_logp.device)  # (B, 1): the root
    level_scores, level_parents, level_ranks = [], [], []
    for level, width in enumerate(widths):
        scores, parent_pos, rank = _beam_step(scores, rank_logp[:, level], width)  # (B, W_d)
        level_scores.append(scores)
        level_parents.append(parent_pos)
        level_ranks.append(rank)
    # Everything that does not feed the next depth is done once, over the whole union.
    rank_offset, parent_start, depth = _union_layout(widths, rank_logp.shape[2], rank_logp.device)
    tokens = rank_tokens.flatten(1).gather(1, torch.cat(level_ranks, dim=1) + rank_offset)
    parents = torch.cat(level_parents, dim=1) + parent_start
    return torch.cat(level_scores, dim=1), tokens, parents, depth


@functools.lru_cache(maxsize=256)
def _union_layout(
    widths: tuple[int, ...], num_ranks: int, device: torch.device
) -> tuple[Tensor, Tensor, Tensor]:
    """Per union entry (U,): the offset of its depth in (L*K) rank_tokens, the union index
    where its parents' depth starts (the root's extra slot U for depth 1), and its depth.
    Built on the device (safe inside a CUDA-graph capture) and cached: shapes only."""
    starts = [0, *itertools.accumulate(widths)]  # union index of each depth's first entry

    def per_entry(values: list[int]) -> Tensor:
        return torch.cat([torch.full((width,), value, device=device)
                          for width, value in zip(widths, values, strict=True)])

    levels = range(len(widths))
    return (per_entry([level * num_ranks for level in levels]),
            per_entry([starts[level - 1] if level else starts[-1] for level in levels]),
            per_entry([level + 1 for level in levels]))


def _check_budget(budget: int, max_topk: int | None, num_levels: int, vocab: int) -> int:
    """Validates the request's budget / max_topk (Python ints only); returns K."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise InvalidArgumentError(f"budget must be an integer >= 1, got {budget!r}")
    if max_topk is not None and (
        isinstance(max_topk, bool) or not isinstance(max_topk, int) or max_topk < 1
    ):
        raise InvalidArgumentError(f"max_topk must be None or an integer >= 1, got {max_topk!r}")
    num_ranks = min(budget, vocab, budget if max_topk is None else max_topk)
    available = sum(_beam_widths(budget, num_ranks, num_levels))
    if available < budget:
        # Widths are capped at the budget, so here no cap was hit: `available` is exact.
        raise InvalidArgumentError(
            f"budget {budget} exceeds the {available} distinct draft prefixes of depth <= "
            f"{num_levels} with the top {num_ranks} tokens per depth"
        )
    return num_ranks


@functools.lru_cache(maxsize=256)
def _beam_widths(budget: int, num_ranks: int, num_levels: int) -> tuple[int, ...]:
    """Beam width per depth d = 1..L: min(N - d + 1, K^d) (at least 1), computed without
    ever forming a huge power. A depth-d prefix that ranks p-th (from 0) among its depth
    comes after the p above it and its own d - 1 ancestors (higher scores, or ties won by
    the shallower prefix), so only p <= N - d can enter N nodes; and the top N - d + 1 of
    depth d extend the top N - d + 2 of depth d - 1 (each prefix above a parent has a
    best child at least as good as any of that parent's children)."""
    widths, width = [], 1
    for depth in range(1, num_levels + 1):
        width = max(1, min(budget - depth + 1, width * num_ranks))
        widths.append(width)
    return tuple(widths)


def _beam_step(prev_scores: Tensor, logp: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor]:
    """Extends the beam (B, W) of sorted prefix scores by one depth with logp (B, K).

    Returns the new beam's scores (B, width), each entry's parent position and token rank.
    """
    batch, num_parents = prev_scores.shape
    if num_parents == 1:
        # Depth 1: the root's extensions are the ranks themselves, already in beam order.
        rank = torch.arange(width, device=logp.device).expand(batch, width)
        return prev_scores + logp[:, :width], torch.zeros_like(rank), rank
    parent_pos, rank = _candidate_pairs(num_parents, logp.shape[1], width,
                                        prev_scores.device)  # (M,), (M,)
    candidates = prev_scores[:, parent_pos] + logp[:, rank]  # (B, M)
    scores, pick = _top_sorted(candidates, width)  # (B, width)
    return scores, parent_pos[pick], rank[pick]


@functools.lru_cache(maxsize=256)
def _candidate_pairs(
    num_parents: int, num_ranks: int, width: int, device: torch.device
) -> tuple[Tensor, Tensor]:
    """(parent position, rank) of every extension that can enter the next beam, p-major.

    Parents and ranks are both sorted, so extension (p, r) trails the (p+1)(r+1) - 1
    extensions (p' <= p, r' <= r): they score at least as much and win ties (lower flat
    index). Only (p+1)(r+1) <= width can make the top `width`: about width*ln(width)
    candidates instead of W*K. Built on the device from a static count (no copy, so it
    is safe inside a CUDA-graph capture) and cached: they depend on shapes only.
    """
    count = sum(min(num_ranks, width // (p + 1)) for p in range(num_parents))
    per_parent = (width // torch.arange(1, num_parents + 1, device=device)).clamp(max=num_ranks)
    ends = per_parent.cumsum(0)  # (W,)
    flat = torch.arange(count, device=device)
    parent_pos = torch.searchsorted(ends, flat, right=True)
    return parent_pos, flat - (ends - per_parent)[parent_pos]


def _top_sorted(values: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest of values (B, M), largest first, ties to the lower index; and their
    indices. torch.topk leaves the order of ties unspecified, a stable sort does not (and
    on these short candidate lists it is also faster). Scores are sums of
    `rank_log_probs`, which are never -0.0, so the sort's -0.0 < 0.0 cannot split a tie."""
    ordered, index = values.sort(dim=-1, descending=True, stable=True)
    return ordered[:, :k], index[:, :k]


# The fused top-K's log-sum-exp (`vocab_topk.topk_logsumexp`) where it runs; False:
# torch.logsumexp beside it (benchmarks' A/B: an extra pass over the logits, as the
# log-softmax that went before it was).
_fused_lse = True


def set_fused_lse(enabled: bool) -> bool:
    """Turns the top-K kernels' own log-sum-exp on or off for launches from now on;
    returns the old setting. CUDA graphs keep what they captured."""
    global _fused_lse
    previous, _fused_lse = _fused_lse, bool(enabled)
    return previous


def _ranks(logits: Tensor, num_ranks: int, kernel: bool) -> tuple[Tensor, Tensor]:
    """logits (B, L, V) float32 -> each depth's num_ranks most probable tokens (B, L, K),
    most probable first, ties to the lower id (the log-softmax is monotone: the logits'
    order), and each depth's log-sum-exp (B, L). `kernel`: the vocabulary top-K kernels
    where they take the shape (their log-sum-exp too, from the same pass), else torch."""
    if kernel and vocab_topk.supports(logits.shape[-1], num_ranks):
        rank_tokens, lse = vocab_topk.topk_logsumexp(logits, num_ranks)
        if not _fused_lse:
            lse = torch.logsumexp(logits, dim=-1)
        return rank_tokens, lse
    return _stable_topk(logits, num_ranks), torch.logsumexp(logits, dim=-1)


def rank_log_probs(logits: Tensor, rank_tokens: Tensor, lse: Tensor) -> Tensor:
    """The draft log-probabilities of the ranked tokens (B, L, K): logit - log-sum-exp in
    float32, 0.0 for -0.0 (a tie must not split on the sign of a zero); the tree build
    kernel computes the same, bitwise."""
    logp = logits.gather(-1, rank_tokens) - lse[..., None]
    return torch.where(logp == 0, 0.0, logp)


def _stable_topk(x: Tensor, k: int) -> Tensor:
    """Indices of the k largest values along the last dim of a float32 x (..., V),
    largest first, ties to the lower index (-0.0 ties 0.0).

    Over the whole vocabulary a sort is too slow, and torch.topk picks among ties as it
    likes. So rank a unique int64 key instead: the IEEE bits of x made monotone as an
    unsigned 32-bit number (sign-magnitude to an order), times V, plus the reversed index.
    """
    size = x.shape[-1]
    bits = torch.where(x == 0, 0.0, x).view(torch.int32)
    ordered = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).long() + (1 << 31)
    key = _reversed_index(size, x.device).add(ordered, alpha=size)  # (..., V) int64
    return key.topk(k, dim=-1).indices


@functools.lru_cache(maxsize=16)
def _reversed_index(size: int, device: torch.device) -> Tensor:
    """(size,) int64: size-1, ..., 0 (the tie-break part of the topk key)."""
    return torch.arange(size - 1, -1, -1, device=device)


def _assemble(
    bonus: Tensor, pick: Tensor, node_scores: Tensor, union_tokens: Tensor,
    union_parents: Tensor, union_depth: Tensor,
) -> DraftTree:
    """The picked union entries pick (B, N), scored node_scores (B, N), as nodes 1..N with
    parents remapped from union indices (B, U) to node indices."""
    batch, budget = pick.shape
    device = pick.device
    # node_of[b, u] = node index of union entry u; the extra last column is the root (0).
    node_of = torch.zeros(batch, union_tokens.shape[1] + 1, dtype=torch.long, device=device)
    node_of.scatter_(1, pick, torch.arange(1, budget + 1, device=device).expand(batch, budget))
    root = torch.zeros(batch, 1, dtype=torch.long, device=device)
    return DraftTree(
        tokens=torch.cat([bonus.long()[:, None], union_tokens.gather(1, pick)], dim=1),
        parents=torch.cat([root - 1, node_of.gather(1, union_parents.gather(1, pick))], dim=1),
        depth=torch.cat([root, union_depth[pick]], dim=1),
        scores=torch.cat([root.float(), node_scores], dim=1),
    )


# ---------------------------------------------------------------------------- structure


def _num_doublings(num_rows: int) -> int:
    """Pointer-doubling rounds that cover any depth < num_rows: ceil(log2(num_rows))."""
    return (num_rows - 1).bit_length()


def depths_from_parents(parents: Tensor) -> Tensor:
    """parents (..., 1+N), topologically ordered -> depth (..., 1+N) int64 (root 0)."""
    depth = (parents >= 0).long()  # distance from each node to `hop`
    hop = parents.long().clamp(min=0)
    for _ in range(_num_doublings(parents.shape[-1])):
        depth, hop = depth + depth.gather(-1, hop), hop.gather(-1, hop)
    return depth


def ancestor_chains(parents: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """parents (B, 1+N), topologically ordered -> depth (B, 1+N) and chains (B, 1+N, width)
    with chains[b, i, d] the ancestor of node i at depth d for d <= depth[b, i] (node i
    itself at its own depth), 0 past it. Needs width > the deepest node's depth. Pointer
    doubling: a node's d-th ancestor is composed of 2^k-th ancestors, so log2(width)
    gathers instead of one per depth, and no host sync."""
    batch, num_rows = parents.shape
    device = parents.device
    depth = depths_from_parents(parents)
    levels = torch.arange(width, device=device)
    hops = (depth[:, :, None] - levels[None, None, :]).clamp(min=0)  # (B, 1+N, W)
    node = torch.arange(num_rows, device=device)[None, :, None].expand(batch, num_rows, width)
    jump = parents.clamp(min=0)  # 2^k-th ancestor; the root is its own
    for k in range(max(1, (width - 1).bit_length())):
        hop = jump.gather(1, node.reshape(batch, -1)).view_as(node)
        node = torch.where(((hops >> k) & 1) == 1, hop, node)
        jump = jump.gather(1, jump)
    return depth, torch.where(levels[None, None, :] <= depth[:, :, None], node, 0)
