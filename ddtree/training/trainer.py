"""Training a DFlash drafter on the target's own responses (ALGORITHMS.md section 5).

Frozen: the target (it only supplies features: the outputs of its `target_layer_ids`
decoder layers, transformers' `hidden_states[l + 1]`), its embedding table and LM head.
Trained: the draft layers, `fc`, the norms and the learned `mask_embedding` (SmolLM2's
vocabulary has no spare row to serve as a mask token). AdamW, warmup then cosine, gradient
clipping, bf16 autocast on GPU. The schedule runs on a progress fraction
`max(step / max_steps, elapsed / max_seconds)`, so a wall-clock budget ends training at
the bottom of the cosine instead of cutting it mid-way.

Writes `<work_dir>/train/{state.pt, log.jsonl, stats.json}` (state.pt makes `resume`
work) and the drafter in z-lab's format (bf16) to `out_dir` via `save_drafter`.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from ddtree.errors import InvalidArgumentError
from ddtree.models.checkpoint import read_config
from ddtree.models.drafter import (
    DFlashDrafter,
    DrafterConfig,
    save_drafter,
)
from ddtree.models.drafter_config import default_target_layer_ids
from ddtree.models.target import TargetEmbeddings, load_target_embeddings
from ddtree.training.data import BlockBatch, SequenceStore, make_batch
from ddtree.training.responses import completed_shards


@dataclass(frozen=True)
class TrainConfig:
    num_layers: int = 2
    intermediate_size: int | None = None  # None: the target's
    target_layer_ids: tuple[int, ...] | None = None  # None: z-lab's default spacing
    block_size: int = 16
    num_anchors: int = 32  # blocks per sequence per step
    batch_size: int = 32  # sequences per step
    lr: float = 6e-4
    weight_decay: float = 0.01
    warmup_fraction: float = 0.04
    grad_clip: float = 1.0
    max_steps: int = 2000
    max_seconds: float | None = None
    eval_fraction: float = 0.02
    max_eval_sequences: int = 256
    log_every: int = 10
    save_every: int = 200
    seed: int = 0


def drafter_config_for(target_hf: dict[str, Any], config: TrainConfig) -> DrafterConfig:
    """The drafter's shape: the target's hidden size, heads, RoPE and vocabulary (it
    shares the target's embeddings and positions), our depth / width / feature layers."""
    num_target_layers = int(target_hf["num_hidden_layers"])
    layer_ids = config.target_layer_ids or default_target_layer_ids(
        num_target_layers, config.num_layers)
    heads = int(target_hf["num_attention_heads"])
    rope = target_hf.get("rope_parameters") or {}
    return DrafterConfig(
        hidden_size=int(target_hf["hidden_size"]), num_hidden_layers=config.num_layers,
        num_attention_heads=heads,
        num_key_value_heads=int(target_hf.get("num_key_value_heads") or heads),
        head_dim=int(target_hf.get("head_dim") or target_hf["hidden_size"] // heads),
        intermediate_size=config.intermediate_size or int(target_hf["intermediate_size"]),
        vocab_size=int(target_hf["vocab_size"]), block_size=config.block_size,
        num_target_layers=num_target_layers, target_layer_ids=tuple(layer_ids),
        mask_token_id=None, has_mask_embedding=True,
        rms_norm_eps=float(target_hf.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", target_hf.get("rope_theta", 10000.0))),
        max_position_embeddings=int(target_hf.get("max_position_embeddings", 8192)),
        extra={k: target_hf[k] for k in ("bos_token_id", "eos_token_id") if k in target_hf})


def init_drafter(drafter: DFlashDrafter, final_norm: Tensor, generator: torch.Generator) -> None:
    """Linear weights and `mask_embedding` ~ N(0, 0.02) (the HF initializer); `norm` starts
    as the target's final norm, so the borrowed LM head sees inputs at the scale it was
    trained on (a smaller norm would have to grow for thousands of steps before logits
    could be confident). Measured on SmolLM2: a mask row set to the mean embedding instead
    starts at loss ~100 rather than ~38 (the mean is a direction every embedding shares)."""
    with torch.no_grad():
        for module in drafter.modules():
            if isinstance(module, nn.Linear):
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * 0.02)
        drafter.norm.weight.copy_(final_norm)
        drafter.mask_embedding.copy_(
            torch.randn(drafter.mask_embedding.shape, generator=generator) * 0.02)


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
        out = self.base(input_ids=input_ids, output_hidden_states=True, use_cache=False)
        return torch.cat([out.hidden_states[i + 1] for i in self.layer_ids], dim=-1)


def block_loss(drafter: DFlashDrafter, embeddings: TargetEmbeddings, features: Tensor,
               batch: BlockBatch) -> tuple[Tensor, dict[str, Tensor]]:
    """Weighted cross-entropy over the valid block positions. features: (B, S, k*H).
    Returns the loss and detached metrics: `correct` (B, n, b-1) bool (greedy draft equals
    the label, False where ignored) and `keep` (B, n, b-1) bool (positions that count)."""
    b = drafter.config.block_size
    batch_size, seq_len = batch.input_ids.shape
    fused = drafter.fuse(features.to(drafter.fc.weight.dtype))  # (B, S, H)
    ctx_positions = torch.arange(seq_len, device=fused.device).expand(batch_size, -1)
    block = drafter.block_embeddings(batch.bonus, embeddings, b)  # (B, Q, H)
    hidden = drafter.forward_blocks(fused, ctx_positions, block, batch.block_positions,
                                    batch.visible)  # (B, Q, H)
    hidden = hidden.view(batch_size, -1, b, hidden.shape[-1])[:, :, 1:]  # (B, n, b-1, H)
    keep = batch.weights > 0  # (B, n, b-1)
    logits = embeddings.logits(hidden[keep][None])[0]  # (K, V) float32
    labels = batch.labels[keep]
    weights = batch.weights[keep]
    ce = F.cross_entropy(logits, labels, reduction="none")  # (K,)
    loss = (weights * ce).sum() / weights.sum().clamp(min=1e-6)
    correct = torch.zeros_like(keep)
    correct[keep] = logits.detach().argmax(-1) == labels
    return loss, {"correct": correct, "keep": keep}


def summarize(correct: Tensor, keep: Tensor) -> dict[str, Any]:
    """correct, keep: (B, n, b-1) -> acc1 (position 1 accuracy), accuracy per position and
    tau, the mean acceptance length of greedy chain drafting (1 + leading correct
    positions; a block cut by the end of its sequence counts what fits)."""
    blocks = keep[..., 0]  # (B, n): real blocks
    valid = correct[blocks].float()  # (blocks, b-1)
    if valid.numel() == 0:
        return {"acc1": 0.0, "tau": 1.0, "acc_by_position": []}
    streak = valid.cumprod(dim=-1).sum(-1)
    per_position = correct.flatten(0, 1).sum(0) / keep.flatten(0, 1).sum(0).clamp(min=1)
    return {"acc1": float(valid[:, 0].mean()), "tau": float(1.0 + streak.mean()),
            "acc_by_position": [round(float(a), 4) for a in per_position]}


def lr_factor(progress: float, warmup_fraction: float) -> float:
    """Linear warmup to 1 over `warmup_fraction`, then cosine down to 0 at progress 1."""
    if progress < warmup_fraction:
        return max(progress / warmup_fraction, 1e-3)
    ramp = (progress - warmup_fraction) / max(1e-9, 1.0 - warmup_fraction)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, ramp)))


def batch_for_step(store: SequenceStore, indices: Sequence[int], step: int,
                   config: TrainConfig, device: torch.device | str = "cpu") -> BlockBatch:
    """The batch of `step`, a pure function of (seed, step): epochs walk seeded
    permutations of `indices`, anchors come from a generator seeded by the step, so a
    resumed run sees exactly the batches an uninterrupted one would."""
    picks = []
    for slot in range(step * config.batch_size, (step + 1) * config.batch_size):
        epoch, offset = divmod(slot, len(indices))
        picks.append(indices[int(_epoch_order(config.seed, epoch, len(indices))[offset])])
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
    return make_batch([store.get(i) for i in picks], config.block_size, config.num_anchors,
                      generator, device)


@functools.lru_cache(maxsize=4)
def _epoch_order(seed: int, epoch: int, size: int) -> Tensor:
    return torch.randperm(size, generator=torch.Generator().manual_seed(seed + epoch))


class Trainer:
    """One training run: the frozen target pieces, the drafter, its optimizer and the
    files in `<work_dir>/train/`."""

    def __init__(self, target_dir: Path, store: SequenceStore, work_dir: Path,
                 config: TrainConfig, device: torch.device) -> None:
        self.config, self.device, self.store = config, device, store
        self.train_dir = Path(work_dir) / "train"
        self.train_dir.mkdir(parents=True, exist_ok=True)
        self.train_indices, self.eval_indices = store.split(config.eval_fraction, config.seed)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.drafter_config = drafter_config_for(read_config(target_dir), config)
        self.features = TargetFeatures(target_dir, self.drafter_config.target_layer_ids,
                                       device, dtype)
        self.embeddings = load_target_embeddings(target_dir, device, dtype)
        self.drafter = DFlashDrafter(self.drafter_config)
        init_drafter(self.drafter, self.features.base.norm.weight.detach().float().cpu(),
                     torch.Generator().manual_seed(config.seed))
        self.drafter.to(device).train()
        matrices = [p for p in self.drafter.parameters() if p.ndim >= 2]
        vectors = [p for p in self.drafter.parameters() if p.ndim < 2]  # norms, mask row
        self.optimizer = torch.optim.AdamW(
            [{"params": matrices, "weight_decay": config.weight_decay},
             {"params": vectors, "weight_decay": 0.0}], lr=config.lr, betas=(0.9, 0.95),
            fused=device.type == "cuda")

    def autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, dtype=torch.bfloat16,
                              enabled=self.device.type == "cuda")

    def train_step(self, step: int, lr: float, want_metrics: bool) -> dict[str, Any] | None:
        batch = batch_for_step(self.store, self.train_indices, step, self.config, self.device)
        features = self.features(batch.input_ids)
        with self.autocast():
            loss, metrics = block_loss(self.drafter, self.embeddings, features, batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(self.drafter.parameters(), self.config.grad_clip)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        if not want_metrics:  # reading values back would stall the GPU queue every step
            return None
        summary = summarize(metrics["correct"], metrics["keep"])
        return {"loss": round(float(loss.detach()), 5), "grad_norm": round(float(grad_norm), 4),
                "acc1": round(summary["acc1"], 4), "tau": round(summary["tau"], 4)}

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """Loss, accuracy per block position and tau on the held-out sequences (fixed
        anchors, so two evaluations of the same drafter agree)."""
        indices = self.eval_indices[:self.config.max_eval_sequences]
        self.drafter.eval()
        loss_sum, num_batches, corrects, keeps = 0.0, 0, [], []
        for begin in range(0, len(indices), self.config.batch_size):
            chunk = [self.store.get(i) for i in indices[begin:begin + self.config.batch_size]]
            generator = torch.Generator().manual_seed(10_007 + begin)
            batch = make_batch(chunk, self.config.block_size, self.config.num_anchors,
                               generator, self.device)
            with self.autocast():
                loss, metrics = block_loss(self.drafter, self.embeddings,
                                           self.features(batch.input_ids), batch)
            loss_sum, num_batches = loss_sum + float(loss), num_batches + 1
            corrects.append(metrics["correct"].flatten(0, 1).cpu())
            keeps.append(metrics["keep"].flatten(0, 1).cpu())
        self.drafter.train()
        if not num_batches:
            return {}
        summary = summarize(torch.cat(corrects)[None], torch.cat(keeps)[None])
        return {"loss": round(loss_sum / num_batches, 5), "num_sequences": len(indices),
                **summary}

    def save_state(self, step: int, elapsed: float) -> None:
        state = {"drafter": self.drafter.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "step": step, "elapsed": elapsed, "config": asdict(self.config)}
        partial = self.train_dir / "state.pt.partial"
        torch.save(state, partial)
        partial.replace(self.train_dir / "state.pt")

    def load_state(self) -> tuple[int, float]:
        """(step, elapsed seconds) of the saved run; (0, 0.0) when there is none."""
        path = self.train_dir / "state.pt"
        if not path.exists():
            return 0, 0.0
        state = torch.load(path, map_location=self.device, weights_only=True)
        self.drafter.load_state_dict(state["drafter"])
        self.optimizer.load_state_dict(state["optimizer"])
        return int(state["step"]), float(state["elapsed"])

    def fit(self, resume: bool, progress: bool) -> tuple[int, float]:
        """Runs steps until the progress fraction reaches 1; returns (steps, seconds)."""
        config = self.config
        step, elapsed = self.load_state() if resume else (0, 0.0)
        start = time.perf_counter() - elapsed
        bar = tqdm(total=config.max_steps, initial=step, desc="train drafter", unit="step",
                   disable=not progress)
        with open(self.train_dir / "log.jsonl", "a" if resume else "w") as log:
            while True:
                elapsed = time.perf_counter() - start
                budget = elapsed / config.max_seconds if config.max_seconds else 0.0
                fraction = max(step / config.max_steps, budget)
                if fraction >= 1.0:
                    break
                lr = config.lr * lr_factor(fraction, config.warmup_fraction)
                metrics = self.train_step(step, lr, step % config.log_every == 0)
                step += 1
                bar.update()
                if metrics is not None:
                    record = {"step": step, "lr": lr, "elapsed": round(elapsed, 2), **metrics}
                    log.write(json.dumps(record) + "\n")
                    log.flush()
                    bar.set_postfix(loss=metrics["loss"], tau=metrics["tau"])
                if step % config.save_every == 0:
                    self.save_state(step, elapsed)
        bar.close()
        self.save_state(step, elapsed)
        return step, elapsed


def train_drafter(target_dir: Path, out_dir: Path, work_dir: Path, config: TrainConfig,
                  device: torch.device, resume: bool = False,
                  progress: bool = True) -> dict[str, Any]:
    """Trains on the response shards in `work_dir`, writes the bf16 drafter to `out_dir`
    and `<work_dir>/train/stats.json`; returns the stats."""
    store = SequenceStore.load(completed_shards(Path(work_dir)))
    if len(store) < 2:
        raise InvalidArgumentError(f"{len(store)} usable responses in {work_dir}/responses: "
                                   "run the generate stage first")
    trainer = Trainer(Path(target_dir), store, Path(work_dir), config, device)
    steps, seconds = trainer.fit(resume, progress)
    evaluation = trainer.evaluate()
    final = copy.deepcopy(trainer.drafter).to(torch.bfloat16).eval()
    save_drafter(final, out_dir)
    stats = {
        "steps": steps, "train_seconds": round(seconds, 1),
        "num_sequences": len(store), "num_train_sequences": len(trainer.train_indices),
        "num_response_tokens": store.num_response_tokens(),
        "drafter_params": sum(p.numel() for p in final.parameters()),
        "drafter_bytes": sum(f.stat().st_size for f in Path(out_dir).iterdir() if f.is_file()),
        "eval": evaluation, "config": asdict(config),
        "drafter_config": final.config.to_hf(),
    }
    (trainer.train_dir / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats
