"""THE ROUND, for every row of a batch at once, in device code only (no host sync, static
shapes per bucket, so each half is captured in one CUDA graph):

  draft:   append each row's newly committed features to the drafter's context, draft a
           block per row, build each row's tree (ar rows: the root; linear: the chain;
           tree: the best `budget` prefixes; shadow: the chain plus the best others)
  verify:  ONE target forward over all trees (per-row positions committed + depth, each
           node attending to its row's committed prefix and its ancestors)
  walk:    per-row greedy or lossless sampled acceptance, linear rule or full tree
  commit:  KV compaction of the accepted paths, the drafter's next features, lengths and
           bonus tokens, and one small output table for the host to read

The host reads only `RoundBuffers.out` after a round: (B, 2 + 2 Kt) int64 =
[acceptance length, next bonus, committed tokens (Kt), path node indices (Kt)].
A greedy round of ar rows only writes the same table from a shorter verify (the forward
and one argmax: `_verify_greedy_ar`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree.acceptance import walk
from ddtree.engine.drafting import LocalDrafter, propose_trees
from ddtree.engine.state import (
    BONUS,
    BUDGET,
    COMMITTED,
    FIRST_CHILD,
    FORCE_CHAIN,
    MAX_TOPK,
    PENDING,
    SlotState,
)
from ddtree.kernels import draft_prologue, round_commit
from ddtree.models.kv_pool import KVPool
from ddtree.models.meta import AttentionMeta, tree_meta
from ddtree.models.target import TargetModel
from ddtree.tree import DraftTree, ancestor_chains


@dataclass(frozen=True)
class BucketKey:
    """A static round shape: batch rows, tree nodes besides the root (0 = ar only), and
    the sampling variant (any row sampled; any row with top-k / top-p)."""

    batch: int
    num_nodes: int
    sampled: bool = False
    filtered: bool = False


class RoundBuffers:
    """The static tensors of one (batch, num_nodes) shape; the host writes `rows` (pool
    slots, padding = scratch) and, with a remote drafter, the tree; it reads `out`."""

    def __init__(self, batch: int, num_nodes: int, width: int, device: torch.device) -> None:
        self.batch, self.num_nodes, self.width = batch, num_nodes, width
        shape = (batch, 1 + num_nodes)
        self.rows = torch.zeros(batch, dtype=torch.long, device=device)
        self.tokens = torch.zeros(shape, dtype=torch.long, device=device)
        self.parents = torch.full(shape, -1, dtype=torch.long, device=device)
        self.depth = torch.zeros(shape, dtype=torch.long, device=device)
        self.valid = torch.zeros(shape, dtype=torch.bool, device=device)
        self.out = torch.zeros(batch, 2 + 2 * width, dtype=torch.long, device=device)
        self.last_slots: list[int] = []  # what `rows` holds (the host skips an equal copy)
        # Two host copies of `out`, used in turn: one may still be read by the host while
        # the next round's copy lands in the other (pinned, so the copy is asynchronous).
        pinned = device.type == "cuda"
        self._host_out = [torch.zeros(self.out.shape, dtype=torch.long, pin_memory=pinned)
                          for _ in range(2)]
        self._next_host = 0

    @classmethod
    def over(cls, rows: Tensor, tokens: Tensor, parents: Tensor, depth: Tensor,
             valid: Tensor, width: int) -> RoundBuffers:
        """Another process's buffers of one shape, opened here (the shared draft link: the
        draft half reads `rows` and writes the tree; `out` stays the owner's)."""
        buffers = cls.__new__(cls)
        buffers.batch, buffers.num_nodes = tokens.shape[0], tokens.shape[1] - 1
        buffers.width = width
        buffers.rows, buffers.tokens, buffers.parents = rows, tokens, parents
        buffers.depth, buffers.valid = depth, valid
        buffers.last_slots = []
        return buffers

    def tree_tensors(self) -> dict[str, Tensor]:
        """What the draft half reads and writes, by name (RoundBuffers.over's arguments)."""
        return {"rows": self.rows, "tokens": self.tokens, "parents": self.parents,
                "depth": self.depth, "valid": self.valid}

    def set_root_only(self, bonus: Tensor) -> None:
        """Every row's tree is its root alone (bonus: (B,) the roots' tokens): a draft half
        that failed."""
        self.tokens[:, 0] = bonus
        self.parents.fill_(-1)
        self.depth.fill_(1)
        self.depth[:, 0] = 0
        self.valid.fill_(False)
        self.valid[:, 0] = True

    def next_host_out(self) -> Tensor:
        host = self._host_out[self._next_host]
        self._next_host ^= 1
        return host

    def tree(self) -> DraftTree:
        return DraftTree(self.tokens, self.parents, self.depth, valid=self.valid)

    def set_tree(self, tree: DraftTree) -> None:
        self.tokens.copy_(tree.tokens)
        self.parents.copy_(tree.parents)
        self.depth.copy_(tree.depth)
        assert tree.valid is not None
        self.valid.copy_(tree.valid)


# The state columns a draft half reads, in `draft_prologue.gather_rows`' table order.
DRAFT_COLUMNS = (COMMITTED, PENDING, BONUS, BUDGET, FORCE_CHAIN, MAX_TOPK)


def draft_into(state: SlotState, drafter: LocalDrafter, buffers: RoundBuffers) -> None:
    """The draft half: trees for every row of `buffers.rows`, written into `buffers`. On
    the kernels the rows' state columns and pending features come from one gather kernel
    (`draft_prologue.gather_rows`) and the tree build writes the buffers itself."""
    assert state.pending is not None, "drafting needs the target's features"
    rows = buffers.rows
    backend = drafter.backend
    if backend.kernels and backend.draft_prologue:
        table, pending = draft_prologue.gather_rows(rows, state.ints, DRAFT_COLUMNS,
                                                    state.pending)
        committed, num_pending, bonus, budget, force_chain, max_topk = table  # (B,) each
    else:
        committed, num_pending, bonus, budget, force_chain, max_topk = (
            state.column(rows, column) for column in DRAFT_COLUMNS)
        pending = state.pending[rows]
    propose_trees(drafter, rows, committed, pending, num_pending, bonus, buffers.num_nodes,
                  budget, force_chain, max_topk, out=buffers.tree())


@dataclass(frozen=True, eq=False)
class VerifyOutput:
    """logits: (B, 1+N, V) float32 (the host reads logprobs from them when a row asks);
    path_features: (B, Kt, k*H) the target features of each row's path nodes, or None."""

    logits: Tensor
    path_features: Tensor | None


def verify_into(state: SlotState, target: TargetModel, pool: KVPool, buffers: RoundBuffers,
                key: BucketKey, feature_layers: Sequence[int],
                keep_pending: bool = True, fast_ar: bool = True) -> VerifyOutput:
    """The verify half: one target forward over every row's tree, walk, commit; fills
    `buffers.out`. With `keep_pending` the path's features become each row's pending
    drafter context (`state.pending`, which is b rows wide). A greedy round of ar rows
    only takes `_verify_greedy_ar` (same tokens and pool; `fast_ar=False` walks it as
    one-node trees, which the tests compare it with)."""
    if key.num_nodes == 0 and not key.sampled and fast_ar:
        return _verify_greedy_ar(state, target, pool, buffers)
    backend = target.backend
    if (key.num_nodes and not key.sampled and keep_pending and backend.kernels
            and backend.round_commit):
        return _verify_greedy_tree(state, target, pool, buffers, feature_layers)
    rows = buffers.rows
    committed = state.column(rows, COMMITTED)  # (B,)
    bonus = state.column(rows, BONUS)
    if key.num_nodes == 0:
        zeros = torch.zeros_like(bonus)[:, None]
        tree = DraftTree(bonus[:, None], zeros - 1, zeros)
    else:
        tree = buffers.tree()
    _, chains = ancestor_chains(tree.parents, buffers.width)  # (B, 1+N, Kt): attention, walk
    meta = tree_meta(rows, committed, tree.parents, tree.depth, buffers.width, pool.max_len,
                     chains)
    out = target(tree.tokens.reshape(-1), meta, pool, feature_layers)
    batch, num_rows = tree.tokens.shape
    logits = out.logits.view(batch, num_rows, -1)  # (B, 1+N, V)
    sampling = state.sampling(rows, key.sampled, key.filtered)
    first_child = state.column(rows, FIRST_CHILD).bool()
    walked = walk(tree, logits, sampling, committed, first_child, buffers.width - 1, chains)
    accepted = walked.acceptance_length  # (B,)
    pool.compact(rows, committed, walked.path)
    path_features = None
    if out.features is not None:
        features = out.features.view(batch, num_rows, -1)
        index = walked.path[:, :, None].expand(-1, -1, features.shape[-1])  # (B, Kt, k*H)
        path_features = features.gather(1, index)
        if keep_pending and state.pending is not None:
            state.pending[rows] = path_features.to(state.pending.dtype)
            state.ints[rows, PENDING] = accepted
    state.ints[rows, COMMITTED] = committed + accepted
    state.ints[rows, BONUS] = walked.next_token
    state.reset_scratch()
    buffers.out.copy_(torch.cat([accepted[:, None], walked.next_token[:, None],
                                 tree.tokens.gather(1, walked.path), walked.path], dim=1))
    return VerifyOutput(logits, path_features)


def _verify_greedy_tree(state: SlotState, target: TargetModel, pool: KVPool,
                        buffers: RoundBuffers, feature_layers: Sequence[int]) -> VerifyOutput:
    """A drafted round whose rows all walk greedily, with the bookkeeping around the
    forward in kernels (`Backend.round_commit`): the tree metadata, the argmax split over
    the vocabulary, the walk with the commit, then the KV compaction - the same output
    table, state, pending features and pool as the generic path
    (ddtree/kernels/round_commit.py)."""
    rows, width = buffers.rows, buffers.width
    tree = buffers.tree()
    assert tree.valid is not None
    meta, chains = _kernel_meta(state, rows, tree.parents, tree.depth, width, pool.max_len)
    batch, num_rows = tree.tokens.shape
    out = target(tree.tokens.reshape(-1), meta, pool, feature_layers)
    logits = out.logits.view(batch, num_rows, -1)  # (B, 1+N, V)
    features = out.features if state.pending is not None else None
    round_commit.greedy_walk(
        rows, state.ints, (COMMITTED, BONUS, FIRST_CHILD, PENDING), tree.tokens, tree.parents,
        tree.valid, tree.depth, chains, round_commit.argmax_chunks(out.logits), buffers.out,
        features, state.pending if features is not None else None, state.scratch)
    round_commit.compact(pool.k, pool.v, rows, meta.prefix_len, buffers.out, width,
                         state.scratch)
    return VerifyOutput(logits, None)  # the scratch row's state untouched: no reset


def _kernel_meta(state: SlotState, rows: Tensor, parents: Tensor, depth: Tensor, width: int,
                 max_kv_len: int) -> tuple[AttentionMeta, Tensor]:
    """`tree_meta` of the rows' trees (parents, depth (B, M)) with the committed lengths
    read from the state table, in one kernel (`round_commit.tree_meta`) -> the attention
    description and the ancestor chains (B, M, width)."""
    positions, slots, write_pos, base, num_keys, chains = round_commit.tree_meta(
        rows, state.ints, COMMITTED, parents, depth, width)
    meta = AttentionMeta(
        positions=positions, write_slot=slots, write_pos=write_pos, query_slot=slots,
        prefix_len=base, tree_base=base, tree_keys=chains.view(-1, width),
        num_tree_keys=num_keys, max_kv_len=max_kv_len,
        queries_per_row=1 if parents.shape[1] == 1 else 0)
    return meta, chains


def _verify_greedy_ar(state: SlotState, target: TargetModel, pool: KVPool,
                      buffers: RoundBuffers) -> VerifyOutput:
    """An ar round at T = 0 (every row's tree is its root alone): the walk of a one-node
    tree is the argmax of the row's logits, the root's K/V already sit at slot
    `committed` (nothing to compact), so the round is the forward, one argmax and two
    writes - the same attention description, tokens, pool and output table as the
    generic path, in ~40 fewer kernels. With `Backend.round_commit` the attention
    description, the argmax and the writes are three kernels (the buffers' root column:
    parent -1, depth 0; the argmax split over the vocabulary)."""
    rows = buffers.rows
    bonus = state.column(rows, BONUS)
    backend = target.backend
    if backend.kernels and backend.round_commit:  # the meta and the commit in kernels
        meta, _ = _kernel_meta(state, rows, buffers.parents[:, :1], buffers.depth[:, :1], 1,
                               pool.max_len)
        logits = target(bonus, meta, pool).logits  # (B, V)
        round_commit.ar_commit(rows, state.ints, (COMMITTED, BONUS),
                               round_commit.argmax_chunks(logits), buffers.out, state.scratch)
        return VerifyOutput(logits[:, None], None)  # the scratch row's state untouched
    committed = state.column(rows, COMMITTED)  # (B,)
    ones = torch.ones_like(committed)
    # tree_meta of a root alone: the committed prefix, then the root itself as a tree key.
    meta = AttentionMeta(
        positions=committed, write_slot=rows, write_pos=committed, query_slot=rows,
        prefix_len=committed, tree_base=committed, tree_keys=torch.zeros_like(committed)[:, None],
        num_tree_keys=ones, max_kv_len=pool.max_len, queries_per_row=1)
    logits = target(bonus, meta, pool).logits  # (B, V)
    next_token = logits.argmax(dim=-1)
    state.ints[rows, COMMITTED: BONUS + 1] = torch.stack([committed + 1, next_token], dim=1)
    state.reset_scratch()
    buffers.out.copy_(torch.stack([ones, next_token, bonus, ones - 1], dim=1))
    return VerifyOutput(logits[:, None], None)
