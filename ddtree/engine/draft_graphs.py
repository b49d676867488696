"""The drafter service's round in CUDA graphs: a `LocalDrafter` behind static input
buffers per (batch bucket, node bucket), so a round of the remote drafter is one copy in,
one graph replay and one copy out, as the in-process round is (padding rows point at the
drafter pool's scratch row)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ddtree.engine.config import NODE_BUCKETS
from ddtree.engine.drafting import LocalDrafter, propose_trees
from ddtree.engine.graphs import GraphRunner
from ddtree.tree import DraftTree

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


# Rows of DraftInputs.ints (and of the static int table).
SLOTS, COMMITTED, NUM_PENDING, BONUS, BUDGET, FORCE_CHAIN, MAX_TOPK = range(7)


@dataclass
class DraftInputs:
    """One batch of R rows on the host. ints: (7, R) int64, the rows above; pending:
    (sum num_pending, k*H) each row's features not yet in its context, row after row."""

    ints: np.ndarray
    pending: Tensor


@dataclass
class ProposedTrees:
    """The rows' trees on the host: tokens, parents (R, 1 + the node bucket) int64, row
    r's real nodes its first num_nodes[r] (R,) (the rest padding)."""

    tokens: np.ndarray
    parents: np.ndarray
    num_nodes: np.ndarray


class _Static:
    """The static tensors of one (batch, num_nodes) shape: ints (7, B) (their host
    staging copy, pinned on a GPU; on the CPU the same tensor) and pending (B, b, k*H).
    host_view is host_ints as numpy, where the host writes it."""

    def __init__(self, batch: int, block: int, width: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        on_gpu = device.type == "cuda"
        self.host_ints = torch.zeros(7, batch, dtype=torch.long, pin_memory=on_gpu)
        self.host_view = self.host_ints.numpy()
        self.ints = torch.zeros(7, batch, dtype=torch.long, device=device) if on_gpu else (
            self.host_ints)
        self.pending = torch.zeros(batch, block, width, dtype=dtype, device=device)


class GraphDrafter:
    """`propose` for batches of rows of a LocalDrafter's pool, replayed from CUDA graphs
    on a GPU (called eagerly on the CPU)."""

    def __init__(self, drafter: LocalDrafter, num_slots: int, max_budget: int,
                 feature_width: int, use_graphs: bool = True) -> None:
        self.drafter = drafter
        self.scratch = num_slots
        self.feature_width = feature_width
        weight = drafter.embeddings.embed_tokens.weight
        self.device, self.dtype = weight.device, drafter.drafter.fc.weight.dtype
        self.graphs = GraphRunner(self.device, use_graphs)
        self.batches = tuple(b for b in BATCH_BUCKETS if b < num_slots) + (num_slots,)
        nodes = {n for n in NODE_BUCKETS if n < max_budget} | {max_budget, drafter.depth}
        self.node_buckets = tuple(sorted(nodes))
        self._static: dict[tuple[int, int], _Static] = {}

    @torch.inference_mode()
    def propose(self, inputs: DraftInputs) -> ProposedTrees:
        """The rows' trees on the host. One copy of the ints and one of the features in,
        one copy of the trees out."""
        num_rows = inputs.ints.shape[1]
        batch = next(b for b in self.batches if b >= num_rows)
        max_budget = int(inputs.ints[BUDGET].max())
        num_nodes = next(n for n in self.node_buckets if n >= max_budget)
        static = self._buffers(batch, num_nodes)
        static.host_view[:, :num_rows] = inputs.ints
        static.host_view[:, num_rows:] = 0
        static.host_view[SLOTS, num_rows:] = self.scratch  # padding rows
        if static.ints is not static.host_ints:
            static.ints.copy_(static.host_ints, non_blocking=True)
        static.pending.zero_()
        if inputs.pending.shape[0]:
            counts = inputs.ints[NUM_PENDING]
            index = segment_rows(np.arange(num_rows) * self.drafter.block_size, counts)
            static.pending.view(-1, self.feature_width).index_copy_(  # (B * b, k*H)
                0, torch.from_numpy(index).to(self.device, non_blocking=True),
                inputs.pending.to(self.device, self.dtype, non_blocking=True))
        key = (batch, num_nodes)
        if self.graphs.enabled and key not in self.graphs:
            real = static.ints.clone()
            static.ints[SLOTS].fill_(self.scratch)
            static.ints[1:].zero_()
            self.graphs.capture(key, lambda: self._run(static, num_nodes))
            static.ints.copy_(real)
        tree: DraftTree = self.graphs.run(key, lambda: self._run(static, num_nodes))
        assert tree.valid is not None
        host = torch.stack([tree.tokens, tree.parents, tree.valid.long()])[:, :num_rows]
        tokens, parents, valid = host.cpu().numpy()  # (R, 1 + num_nodes) each
        return ProposedTrees(tokens, parents, valid.sum(axis=1))

    def warm_up(self) -> None:
        """A round of every (batch bucket, node bucket) on the scratch row, largest first,
        before any traffic: compiles the kernels of each shape (the tree build's Triton
        kernel is specialised per size: ~10 s each on a fresh H200 host; blocks of more
        than 128 and 256 rows take other GEMM tiles) and captures its graph, so a
        verifier's first round of a new shape never waits past its deadline (lease 9 call
        25: the drafter was "lost" 10 s into the first auto request) and no batch pays a
        capture (113-149 s for 56 shapes on a fresh H200 host, lease 13). The first
        context's token buckets (`ContextGraphs`, where on) before those."""
        self.drafter.context.warm_up()
        for batch in reversed(self.batches):
            for num_nodes in reversed(self.node_buckets):
                ints = np.zeros((7, batch), dtype=np.int64)
                ints[SLOTS], ints[BUDGET] = self.scratch, num_nodes
                self.propose(DraftInputs(ints, torch.zeros(0, self.feature_width)))

    def _run(self, static: _Static, num_nodes: int) -> DraftTree:
        slots, committed, num_pending, bonus, budget, force, topk = static.ints  # (B,) each
        return propose_trees(self.drafter, slots, committed, static.pending, num_pending,
                             bonus, num_nodes, budget, force, topk)

    def _buffers(self, batch: int, num_nodes: int) -> _Static:
        key = (batch, num_nodes)
        if key not in self._static:
            self._static[key] = _Static(batch, self.drafter.block_size, self.feature_width,
                                        self.device, self.dtype)
        return self._static[key]


def segment_rows(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """(sum counts,) int64: starts[r] + 0 .. counts[r] - 1, row after row (where each
    row's segment of a packed row-after-row tensor lies); no loop over rows. Element j of
    row r's segment is start[r] + (j's place in the output - the segment's first place)."""
    counts = np.asarray(counts, dtype=np.int64)
    ends = np.cumsum(counts)  # (R,) one past each segment's last place
    shift = np.asarray(starts, dtype=np.int64) - (ends - counts)
    return np.repeat(shift, counts) + np.arange(int(ends[-1]) if len(ends) else 0)
