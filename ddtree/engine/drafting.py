"""The drafting step behind one small interface, with two implementations:

- `LocalDrafter` (here): the DFlash drafter on this process's device, its context KV pool
  indexed by the engine's own slots, one batched forward for every row of a round; its
  work is pure device code, captured in the round's CUDA graph. `ddtree generate`, the
  in-process bench and drafter_svc all run it.
- `verifier_svc.drafter_client.RemoteDrafter`: the same step over the gRPC Draft stream
  (the drafter service runs a `LocalDrafter` on its side).

The engine asks a drafter for: `start` (a row's prompt features once, after its prefill),
`release` (the row ended), per round draft trees for a batch of rows, and tells it when
the round's verify is launched (`overlap_verify`: work that may run beside it).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor

from ddtree.models.drafter import DFlashDrafter
from ddtree.models.meta import device_ints
from ddtree.models.ops import Backend
from ddtree.models.target import TargetEmbeddings
from ddtree.tree import DraftTree, build_round_tree


class Drafting(Protocol):
    """What the engine needs of any drafter."""

    block_size: int
    target_layer_ids: tuple[int, ...]

    def start(self, slot: int, request_id: str, features: Tensor) -> None: ...

    def release(self, slot: int, request_id: str) -> None: ...

    def overlap_verify(self, engine: Any) -> None: ...


class LocalDrafter:
    """The drafter model plus its context pool (num_slots + 1 rows: the last is scratch)."""

    def __init__(self, drafter: DFlashDrafter, embeddings: TargetEmbeddings, num_slots: int,
                 max_model_len: int, backend: Backend | None = None) -> None:
        self.drafter = drafter.fuse_weights()
        self.embeddings = embeddings
        self.block_size = drafter.config.block_size
        self.target_layer_ids = tuple(drafter.config.target_layer_ids)
        device = embeddings.embed_tokens.weight.device
        self.backend = backend or Backend.for_device(device)
        # The context (up to L past the last emitted token, plus one pipelined round) plus
        # a block appended past it and a block drafted past that.
        self.pool = drafter.new_pool(num_slots + 1, max_model_len + 4 * self.block_size)

    @property
    def depth(self) -> int:
        """L: draft tokens per block."""
        return self.block_size - 1

    @torch.inference_mode()
    def start(self, slot: int, request_id: str, features: Tensor) -> None:
        """features: (P, k*H) of the P prompt rows: the row's first context (positions 0..)."""
        fused = self.drafter.fuse(features[None].to(self.drafter.fc.weight.dtype))  # (1, P, H)
        device = fused.device
        self.drafter.append_context(self.pool, device_ints([slot], device),
                                    torch.zeros(1, dtype=torch.long, device=device), fused,
                                    self.backend)

    def release(self, slot: int, request_id: str) -> None:
        """Nothing to free: the row's pool slot is reused as a whole."""

    def overlap_verify(self, engine: Any) -> None:
        """Nothing to do beside the verify: a row's first context is stored at `start`."""

    def draft_logits(self, rows: Tensor, committed: Tensor, pending: Tensor,
                     num_pending: Tensor, bonus: Tensor) -> Tensor:
        """Appends each row's pending context, drafts its block; no host sync.

        rows, committed, num_pending, bonus: (B,) int64; pending: (B, b, k*H) features of
        the rows at positions committed - num_pending .. committed - 1 (rows past
        num_pending are ignored: the block overwrites them). -> (B, L, V) float32."""
        fused = self.drafter.fuse(pending.to(self.drafter.fc.weight.dtype))  # (B, b, H)
        self.drafter.append_context(self.pool, rows, committed - num_pending, fused,
                                    self.backend)
        return self.drafter.draft(self.pool, rows, committed, bonus, self.embeddings,
                                  self.backend)


def propose_trees(drafter: LocalDrafter, rows: Tensor, committed: Tensor, pending: Tensor,
                  num_pending: Tensor, bonus: Tensor, num_nodes: int, budget: Tensor,
                  force_chain: Tensor, max_topk: Tensor) -> DraftTree:
    """One round's trees for a batch (B, 1 + num_nodes); see `build_round_tree`."""
    logits = drafter.draft_logits(rows, committed, pending, num_pending, bonus)  # (B, L, V)
    backend = drafter.backend
    return build_round_tree(logits, bonus, num_nodes, budget, force_chain, max_topk,
                            kernels=backend.kernels and backend.tree_build,
                            topk_kernel=backend.kernels and backend.vocab_topk)
