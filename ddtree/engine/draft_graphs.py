"""The drafter service's round in CUDA graphs: a `LocalDrafter` behind static input
buffers per (batch bucket, node bucket), so a round of the remote drafter is one copy in,
one graph replay and one copy out, as the in-process round is (padding rows point at the
drafter pool's scratch row)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree.engine.config import NODE_BUCKETS
from ddtree.engine.drafting import LocalDrafter, propose_trees
from ddtree.engine.graphs import GraphRunner
from ddtree.tree import DraftTree

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass
class DraftInputs:
    """One batch's inputs (host lists, one entry per row; pending (B, b, k*H) on the host)."""

    slots: list[int]
    committed: list[int]
    pending: Tensor
    num_pending: list[int]
    bonus: list[int]
    budget: list[int]
    force_chain: list[bool]
    max_topk: list[int]


class _Static:
    """The static tensors of one (batch, num_nodes) shape: ints (7, B) = slots, committed,
    num_pending, bonus, budget, force_chain, max_topk; and pending (B, b, k*H)."""

    def __init__(self, batch: int, block: int, width: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.ints = torch.zeros(7, batch, dtype=torch.long, device=device)
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
    def propose(self, inputs: DraftInputs) -> DraftTree:
        """The rows' trees, (B, 1 + the node bucket) on the host, `valid` marking each
        row's real nodes (a prefix of the row)."""
        num_rows = len(inputs.slots)
        batch = next(b for b in self.batches if b >= num_rows)
        num_nodes = next(n for n in self.node_buckets if n >= max(inputs.budget))
        static = self._buffers(batch, num_nodes)
        pad = batch - num_rows
        columns = [inputs.slots + [self.scratch] * pad, inputs.committed + [0] * pad,
                   inputs.num_pending + [0] * pad, inputs.bonus + [0] * pad,
                   inputs.budget + [0] * pad, [int(f) for f in inputs.force_chain] + [0] * pad,
                   inputs.max_topk + [0] * pad]
        static.ints.copy_(torch.tensor(columns, dtype=torch.long), non_blocking=True)
        static.pending.zero_()
        static.pending[:num_rows].copy_(inputs.pending, non_blocking=True)
        key = (batch, num_nodes)
        if self.graphs.enabled and key not in self.graphs:
            real = static.ints.clone()
            static.ints[0].fill_(self.scratch)
            static.ints[1:].zero_()
            self.graphs.capture(key, lambda: self._run(static, num_nodes))
            static.ints.copy_(real)
        tree: DraftTree = self.graphs.run(key, lambda: self._run(static, num_nodes))
        assert tree.valid is not None
        host = [t[:num_rows].to("cpu") for t in (tree.tokens, tree.parents, tree.valid)]
        return DraftTree(host[0], host[1], torch.zeros_like(host[0]), valid=host[2])

    def _run(self, static: _Static, num_nodes: int) -> DraftTree:
        slots, committed, num_pending, bonus, budget, force, topk = static.ints
        return propose_trees(self.drafter, slots, committed, static.pending, num_pending,
                             bonus, num_nodes, budget, force.bool(), topk)

    def _buffers(self, batch: int, num_nodes: int) -> _Static:
        key = (batch, num_nodes)
        if key not in self._static:
            self._static[key] = _Static(batch, self.drafter.block_size, self.feature_width,
                                        self.device, self.dtype)
        return self._static[key]
