"""What one training (or evaluation) batch computes: the frozen target's features (and,
for the KL term and T = 1 evaluation, its next-token logits along the sequence), the
drafter's block states, and the loss.

Loss per supervised block position k (weight `exp(-(k-1)/gamma)`, ALGORITHMS.md section
5): cross-entropy to the target's token, optionally mixed with the KL divergence from the
target's own distribution at that position, `(1 - w) * CE + w * KL(p_target || q_drafter)`
(w = `kl_weight`). The KL term teaches the drafter the target's whole distribution, which
is what T > 0 acceptance and the tree's lower ranks depend on.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from ddtree.models.drafter import DFlashDrafter
from ddtree.models.target import TargetEmbeddings
from ddtree.training.data import BlockBatch


class TargetFeatures:
    """The frozen target as a transformers model; `__call__` gives the drafter's features."""

    def __init__(self, target_dir: Path, layer_ids: Sequence[int], device: torch.device,
                 dtype: torch.dtype) -> None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype)
        self.base = model.get_decoder().to(device).eval().requires_grad_(False)
        self.layer_ids = tuple(layer_ids)

    @torch.no_grad()
    def __call__(self, input_ids: Tensor) -> Tensor:
        """input_ids: (B, S) right-padded (causal attention: real tokens never see the
        padding after them) -> (B, S, k*H), outputs of decoder layers `layer_ids`."""
        return self.with_final(input_ids)[0]

    @torch.no_grad()
    def with_final(self, input_ids: Tensor) -> tuple[Tensor, Tensor]:
        """-> (features (B, S, k*H), the final normed hidden state (B, S, H), which the
        LM head turns into the target's next-token logits)."""
        out = self.base(input_ids=input_ids, output_hidden_states=True, use_cache=False)
        features = torch.cat([out.hidden_states[i + 1] for i in self.layer_ids], dim=-1)
        return features, out.last_hidden_state


def block_hidden(drafter: DFlashDrafter, embeddings: TargetEmbeddings, features: Tensor,
                 batch: BlockBatch) -> Tensor:
    """features: (B, S, k*H) -> the drafter's final states of the draft positions,
    (B, n, b-1, H) (before the LM head)."""
    b = drafter.config.block_size
    batch_size, seq_len = batch.input_ids.shape
    fused = drafter.fuse(features.to(drafter.fc.weight.dtype))  # (B, S, H)
    ctx_positions = torch.arange(seq_len, device=fused.device).expand(batch_size, -1)
    block = drafter.block_embeddings(batch.bonus, embeddings, b)  # (B, Q, H)
    hidden = drafter.forward_blocks(fused, ctx_positions, block, batch.block_positions,
                                    batch.visible)  # (B, Q, H)
    return hidden.view(batch_size, -1, b, hidden.shape[-1])[:, :, 1:]  # (B, n, b-1, H)


@torch.no_grad()
def target_logits_at_labels(final_hidden: Tensor, embeddings: TargetEmbeddings,
                            batch: BlockBatch, keep: Tensor) -> Tensor:
    """The target's logits for each kept label: the label of block position k is
    predicted at sequence position anchor + k - 1. final_hidden: (B, S, H) -> (K, V)."""
    seq_len = final_hidden.shape[1]
    num_positions = batch.labels.shape[-1]
    offsets = torch.arange(num_positions, device=final_hidden.device)
    where = (batch.anchors[..., None] + offsets).clamp(max=seq_len - 1)  # (B, n, b-1)
    rows = torch.arange(where.shape[0], device=where.device)[:, None, None].expand_as(where)
    return embeddings.logits(final_hidden[rows[keep], where[keep]][None])[0]


def block_loss(drafter: DFlashDrafter, embeddings: TargetEmbeddings, features: Tensor,
               batch: BlockBatch, target_logits: Tensor | None = None,
               kl_weight: float = 0.0) -> tuple[Tensor, dict[str, Tensor]]:
    """Weighted loss over the valid block positions. features: (B, S, k*H);
    target_logits: (K, V) from `target_logits_at_labels` (needed when kl_weight > 0).
    Returns the loss and detached metrics: `correct` (B, n, b-1) bool (greedy draft equals
    the label, False where ignored), `keep` (B, n, b-1) bool (positions that count),
    `logits` (K, V) the drafter's logits at the kept positions, `hidden` (B, n, b-1, H)."""
    hidden = block_hidden(drafter, embeddings, features, batch)
    keep = batch.weights > 0  # (B, n, b-1)
    logits = embeddings.logits(hidden[keep][None])[0]  # (K, V) float32
    labels = batch.labels[keep]
    weights = batch.weights[keep]
    per_position = F.cross_entropy(logits, labels, reduction="none")  # (K,)
    if kl_weight > 0:
        assert target_logits is not None, "the KL term needs the target's logits"
        log_q = torch.log_softmax(logits, dim=-1)
        log_p = torch.log_softmax(target_logits.float(), dim=-1)
        kl = (log_p.exp() * (log_p - log_q)).sum(-1)  # (K,)
        per_position = (1.0 - kl_weight) * per_position + kl_weight * kl
    loss = (weights * per_position).sum() / weights.sum().clamp(min=1e-6)
    correct = torch.zeros_like(keep)
    correct[keep] = logits.detach().argmax(-1) == labels
    return loss, {"correct": correct, "keep": keep, "logits": logits.detach(),
                  "hidden": hidden.detach()}
