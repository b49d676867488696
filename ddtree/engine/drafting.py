"""The drafting step behind one small interface, with two implementations:

- `LocalDrafter` (here): the DFlash drafter on this process's device, its context KV pool
  indexed by the engine's own slots, one batched forward for every row of a round; its
  work is pure device code, captured in the round's CUDA graph. `ddtree generate`, the
  in-process bench and drafter_svc all run it.
- `verifier_svc.remote_drafter.RemoteDrafter`: the same step over the Draft stream (the
  drafter service runs a `LocalDrafter` on its side).
- `DeviceDrafting` (here), implemented by `verifier_svc.shared_drafter.SharedDrafter`: the
  drafter service runs the draft half over this engine's own round state, shared with it
  (CUDA IPC on one GPU), so that the round reads the device state as in process.

The engine asks a drafter for: `start` (a row's prompt features once, after its prefill),
`release` (the row ended), per round draft trees for a batch of rows, and tells it when
the round's verify is launched (`overlap_verify`: work that may run beside it).
"""

from __future__ import annotations

import abc
import copy
import dataclasses
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from ddtree.engine.graphs import GraphRunner
from ddtree.engine.prefill_graphs import token_buckets
from ddtree.kernels import draft_prologue
from ddtree.models.drafter import DFlashDrafter
from ddtree.models.meta import AttentionMeta, context_meta, device_ints, prologue_metas
from ddtree.models.ops import Backend
from ddtree.models.target import TargetEmbeddings
from ddtree.tree import DraftTree, build_round_tree

if TYPE_CHECKING:
    from ddtree.engine.round import RoundBuffers


class Drafting(Protocol):
    """What the engine needs of any drafter."""

    block_size: int
    target_layer_ids: tuple[int, ...]

    def start(self, slot: int, request_id: str, features: Tensor) -> None: ...

    def release(self, slot: int, request_id: str) -> None: ...

    def overlap_verify(self, engine: Any) -> None: ...


class DeviceDrafting(abc.ABC):
    """A drafter in another process that drafts over this engine's round state itself:
    the engine's per-slot tables and round buffers are shared with it (CUDA IPC on one
    GPU, shared memory on the CPU), so that a round's draft half reads the device state
    like the in-process drafter's graph does and the engine pipelines its rounds the
    same way (verifier_svc/shared_drafter.py)."""

    block_size: int
    target_layer_ids: tuple[int, ...]

    @abc.abstractmethod
    def attach(self, engine: Any) -> None:
        """Shares the engine's tables with the drafter (at the engine's construction)."""

    @abc.abstractmethod
    def start(self, slot: int, request_id: str, features: Tensor) -> None: ...

    def release(self, slot: int, request_id: str) -> None:  # noqa: B027 (nothing to do)
        """Nothing to free: the drafter's pool rows are the engine's slots."""

    def overlap_verify(self, engine: Any) -> None:  # noqa: B027 (nothing to do)
        """Nothing to do beside the verify."""

    @abc.abstractmethod
    def unknown(self, slots: list[int]) -> list[int]:
        """The slots whose drafter context the drafter does not hold now (it restarted
        since their start): they stop drafting before the round."""

    @abc.abstractmethod
    def draft(self, buffers: RoundBuffers) -> bool:
        """Enqueues the draft half of a round: trees for `buffers.rows` written into
        `buffers` before the engine's stream goes on. False when the drafter failed this
        round (the engine then verifies the roots alone and the rows stop drafting)."""


class LocalDrafter:
    """The drafter model plus its context pool (num_slots + 1 rows: the last is scratch)."""

    def __init__(self, drafter: DFlashDrafter, embeddings: TargetEmbeddings, num_slots: int,
                 max_model_len: int, backend: Backend | None = None,
                 context_graphs: bool = False) -> None:
        self.drafter = drafter.fuse_weights()
        self.embeddings = embeddings
        self.block_size = drafter.config.block_size
        self.target_layer_ids = tuple(drafter.config.target_layer_ids)
        device = embeddings.embed_tokens.weight.device
        self.backend = backend or Backend.for_device(device)
        # The context (up to L past the last emitted token, plus one pipelined round) plus
        # a block appended past it and a block drafted past that.
        self.pool = drafter.new_pool(num_slots + 1, max_model_len + 4 * self.block_size)
        # A row's first context through CUDA graphs (the drafter service's --context-graphs,
        # on by default; the verifier's in-process drafter passes False).
        self.context = ContextGraphs(self, context_graphs)

    def sibling(self, num_slots: int, max_model_len: int,
                context_graphs: bool) -> LocalDrafter:
        """The same (fused) model over a context pool of its own: another engine's rows
        (the drafter service's shared draft link, one per verifier). Its weights are not
        fused again: graphs captured over them keep their addresses."""
        twin = copy.copy(self)
        twin.backend = dataclasses.replace(self.backend)
        twin.pool = self.drafter.new_pool(num_slots + 1, max_model_len + 4 * self.block_size)
        twin.context = ContextGraphs(twin, context_graphs)
        return twin

    @property
    def depth(self) -> int:
        """L: draft tokens per block."""
        return self.block_size - 1

    @property
    def scratch(self) -> int:
        """The pool's scratch row (the last)."""
        return self.pool.num_slots - 1

    @torch.inference_mode()
    def start(self, slot: int, request_id: str, features: Tensor, offset: int = 0) -> None:
        """features: (P, k*H) of the P prompt rows: the row's first context at positions
        offset.. (a long prompt may come in parts), through `ContextGraphs` when they are
        on, the part starts the context and P fits a bucket, else eagerly."""
        if offset == 0 and self.context.run(slot, features):
            return
        fused = self.drafter.fuse_infer(features[None], self.backend)  # (1, P, H)
        device = fused.device
        self.drafter.append_context(self.pool, device_ints([slot], device),
                                    device_ints([offset], device), fused, self.backend)

    def release(self, slot: int, request_id: str) -> None:
        """Nothing to free: the row's pool slot is reused as a whole."""

    def overlap_verify(self, engine: Any) -> None:
        """Nothing to do beside the verify: a row's first context is stored at `start`."""

    def draft_logits(self, rows: Tensor, committed: Tensor, pending: Tensor,
                     num_pending: Tensor, bonus: Tensor) -> Tensor:
        """Appends each row's pending context, drafts its block; no host sync.

        rows, committed, num_pending, bonus: (B,) int64; pending: (B, b, k*H) features of
        the rows at positions committed - num_pending .. committed - 1 (rows past
        num_pending are ignored). -> (B, L, V) float32.

        On the batch-invariant kernels (`Backend.context_in_block`) each layer projects
        the context rows in the block's QKV GEMM (`draft_block`'s `joined`: the same bits,
        each row's own; one read of the weight a layer where there were two), the ignored
        rows stored in the scratch row, and where every row goes and the blocks' inputs
        come from one kernel (`draft_prologue.block_inputs`); elsewhere the context is
        appended first and the block overwrites them."""
        backend = self.backend
        if backend.kernels and backend.invariant and backend.context_in_block:
            if not backend.draft_prologue:  # the same, from PyTorch's builders
                fused = self.drafter.fuse_infer(pending, backend)  # (B, b, H)
                meta = context_meta(rows, committed - num_pending, fused.shape[1],
                                    num_pending, self.scratch)
                return self.drafter.draft(self.pool, rows, committed, bonus, self.embeddings,
                                          backend, (fused.flatten(0, 1), meta))
            weight = self.embeddings.embed_tokens.weight
            positions, write_slot, prefix, x = draft_prologue.block_inputs(
                rows, committed, num_pending, bonus, self.block_size, self.scratch, weight,
                self.drafter.mask_row(self.embeddings))
            meta, stored = prologue_metas(positions, write_slot, prefix, self.block_size,
                                          self.pool.max_len)
            # The context rows' fused features, then the blocks' normed rows (every layer's).
            num_context = pending.shape[0] * pending.shape[1]
            joined = x.new_empty(num_context + x.shape[0], x.shape[1])
            self.drafter.fuse_infer(pending, backend, out=joined[:num_context])
            return self.drafter.draft_block(self.pool, x, meta, self.embeddings, backend,
                                            joined, stored)
        fused = self.drafter.fuse_infer(pending, self.backend)  # (B, b, H)
        self.drafter.append_context(self.pool, rows, committed - num_pending, fused,
                                    self.backend)
        return self.drafter.draft(self.pool, rows, committed, bonus, self.embeddings,
                                  self.backend)


class ContextGraphs:
    """A row's first drafter context (its prompt's features: fc, norm, then every layer's
    K/V stored) in static token buckets replayed as CUDA graphs. Eagerly that is ~20
    launches issued from Python, ~1-3 ms of host time per admitted row on the H200 (lease
    18's traces). The drafter service's `--context-graphs` (on by default): there an
    open's context delays the next round of every row on the stream. Lease 23, on one
    machine with the run order alternated, measured +9-14% at c8 and +3-4% at c1 through
    `ddtree serve` (lease 22's -7% at c8 had it first after a cold start). The verifier's
    in-process drafter always stores eagerly: there it measured slower (lease 18, and
    lease 19's in-graph store). The features go into one static buffer (the bucket's
    first rows); rows past the prompt write the scratch row. Off (`run` returns False)
    unless `enabled` on a GPU with graphs, or `static` (the same padded store, eagerly:
    what the CPU test checks)."""

    def __init__(self, local: LocalDrafter, enabled: bool, static: bool = False) -> None:
        self.local = local
        weight = local.drafter.fc.weight
        self.graphs = GraphRunner(weight.device, enabled)
        self.scratch = local.scratch  # rows past the prompt are stored there
        self.buckets: tuple[int, ...] = ()
        if not (self.graphs.enabled or static):
            return
        self.buckets = token_buckets(local.pool.max_len)  # the prefill's, within the pool
        size = max(self.buckets, default=0)
        self.features = torch.zeros(size, weight.shape[1], dtype=weight.dtype,
                                    device=weight.device)
        self.ints = torch.zeros(2, dtype=torch.long, device=weight.device)  # slot, length
        self.positions = torch.arange(size, device=weight.device)

    def run(self, slot: int, features: Tensor) -> bool:
        """Stores the row's first context through its bucket's graph; False when off or
        the prompt fits no bucket (the caller stores it eagerly)."""
        num = features.shape[0]
        size = next((b for b in self.buckets if b >= num), None)
        if size is None:
            return False
        self.features[:num].copy_(features)
        self.ints[1].fill_(num)
        if self.graphs.enabled and size not in self.graphs:  # captured on the scratch row
            self.ints[0].fill_(self.scratch)
            self.graphs.capture(size, lambda: self._store(size))
        self.ints[0].fill_(slot)
        self.graphs.run(size, lambda: self._store(size))
        return True

    def warm_up(self) -> int:
        """Captures every bucket (largest first) on the scratch row. -> buckets."""
        for size in reversed(self.buckets):
            self.run(self.scratch, self.features[:size])
        return len(self.buckets)

    def _store(self, size: int) -> None:
        drafter = self.local.drafter
        fused = drafter.fuse_infer(self.features[:size], self.local.backend)  # (size, H)
        positions = self.positions[:size]
        rows = torch.where(positions < self.ints[1], self.ints[0], self.scratch)
        zeros = torch.zeros_like(positions)
        meta = AttentionMeta(
            positions=positions, write_slot=rows, write_pos=positions, query_slot=rows,
            prefix_len=zeros, tree_base=zeros, tree_keys=zeros[:, None], num_tree_keys=zeros,
            max_kv_len=0)
        drafter.store_context(self.local.pool, meta, fused, self.local.backend)


def propose_trees(drafter: LocalDrafter, rows: Tensor, committed: Tensor, pending: Tensor,
                  num_pending: Tensor, bonus: Tensor, num_nodes: int, budget: Tensor,
                  force_chain: Tensor, max_topk: Tensor,
                  out: DraftTree | None = None) -> DraftTree:
    """One round's trees for a batch (B, 1 + num_nodes); see `build_round_tree` (`out`:
    the round's buffers, written in place)."""
    logits = drafter.draft_logits(rows, committed, pending, num_pending, bonus)  # (B, L, V)
    backend = drafter.backend
    return build_round_tree(logits, bonus, num_nodes, budget, force_chain, max_topk,
                            kernels=backend.kernels and backend.tree_build,
                            topk_kernel=backend.kernels and backend.vocab_topk, out=out)
