"""Training a DFlash drafter on the target's own responses (ALGORITHMS.md section 5).

Frozen: the target (it only supplies features: the outputs of its `target_layer_ids`
decoder layers, transformers' `hidden_states[l + 1]`), its embedding table and LM head.
Trained: the draft layers, `fc`, the norms and the learned `mask_embedding` (SmolLM2's
vocabulary has no spare row to serve as a mask token). AdamW, warmup then cosine, gradient
clipping, bf16 autocast on GPU. The schedule runs on a progress fraction
`max(step / max_steps, elapsed / max_seconds)`, so a wall-clock budget ends training at
the bottom of the cosine instead of cutting it mid-way.

Starts from random weights or, with `init_from`, from an earlier drafter checkpoint (also
a smaller one: `ddtree.training.growth`). Every `eval_every` steps the held-out acceptance
(`ddtree.training.evaluation`) is measured and logged; the best drafter so far is kept
(and handed to `on_best`, which the recipe uses to write it out at once), and training
stops early after `patience` evaluations without a gain of `min_delta` in held-out linear
acceptance at T = 0: acceptance, not loss, is what the drafter is for.

Writes `<work_dir>/train/{state.pt, log.jsonl, stats.json}` (state.pt makes `resume`
work) and the best drafter in z-lab's format (bf16, shards of <= 16 MiB) to `out_dir`.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

from ddtree.errors import InvalidArgumentError
from ddtree.models.checkpoint import read_config
from ddtree.models.drafter import (
    DFlashDrafter,
    save_drafter,
)
from ddtree.models.target import load_target_embeddings
from ddtree.training.data import BlockBatch, SequenceStore, make_batch
from ddtree.training.drafter_init import (
    drafter_config_for,
    grow_into,
    init_drafter,
    read_drafter_state,
)
from ddtree.training.evaluation import (
    chain_acceptance,
    sampled_chain_lower_bound,
    tree_acceptance,
)
from ddtree.training.loss import (
    TargetFeatures,
    block_loss,
    target_logits_at_labels,
)
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
    kl_weight: float = 0.0  # share of KL(target || drafter) in the loss; 0 = tokens only
    eval_every: int = 0  # steps between held-out evaluations (0 = at the end only)
    patience: int = 0  # evaluations without gain before stopping (0 = never stop early)
    min_delta: float = 0.01  # a gain in held-out tau smaller than this is no gain
    eval_tree_budget: int = 64  # tree@N acceptance in evaluations (0 = skip)
    init_from: str | None = None  # a drafter checkpoint dir to start from


def summarize(correct: Tensor, keep: Tensor) -> dict[str, Any]:
    """correct, keep: (B, n, b-1) -> acc1 (position 1 accuracy), accuracy per position and
    tau, the mean acceptance length of greedy chain drafting (1 + leading correct
    positions; a block cut by the end of its sequence counts what fits)."""
    blocks = keep[..., 0]  # (B, n): real blocks
    if not bool(blocks.any()):
        return {"acc1": 0.0, "tau": 1.0, "acc_by_position": []}
    tau = chain_acceptance(correct[blocks], keep[blocks])
    per_position = correct.flatten(0, 1).sum(0) / keep.flatten(0, 1).sum(0).clamp(min=1)
    return {"acc1": float(correct[blocks][:, 0].float().mean()), "tau": float(tau.mean()),
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


@dataclass
class Progress:
    """Where a run stands; saved in state.pt with the weights and the optimizer."""

    step: int = 0
    elapsed: float = 0.0
    best_tau: float = float("-inf")
    best_step: int = -1
    bad_evals: int = 0
    early_stopped: bool = False


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
        if config.init_from:
            grow_into(self.drafter, *read_drafter_state(Path(config.init_from)))
        self.drafter.to(device).train()
        matrices = [p for p in self.drafter.parameters() if p.ndim >= 2]
        vectors = [p for p in self.drafter.parameters() if p.ndim < 2]  # norms, mask row
        self.optimizer = torch.optim.AdamW(
            [{"params": matrices, "weight_decay": config.weight_decay},
             {"params": vectors, "weight_decay": 0.0}], lr=config.lr, betas=(0.9, 0.95),
            fused=device.type == "cuda")
        self.progress = Progress()
        self.best_state: dict[str, Tensor] | None = None
        self.best_eval: dict[str, Any] = {}

    def autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, dtype=torch.bfloat16,
                              enabled=self.device.type == "cuda")

    def batch_loss(self, batch: BlockBatch) -> tuple[Tensor, dict[str, Tensor], Tensor]:
        """(loss, metrics, the target's final hidden states (B, S, H))."""
        features, final = self.features.with_final(batch.input_ids)
        target_logits = None
        if self.config.kl_weight > 0:
            target_logits = target_logits_at_labels(final, self.embeddings, batch,
                                                    batch.weights > 0)
        with self.autocast():
            loss, metrics = block_loss(self.drafter, self.embeddings, features, batch,
                                       target_logits, self.config.kl_weight)
        return loss, metrics, final

    def train_step(self, step: int, lr: float, want_metrics: bool) -> dict[str, Any] | None:
        batch = batch_for_step(self.store, self.train_indices, step, self.config, self.device)
        loss, metrics, _ = self.batch_loss(batch)
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

    def eval_sequences(self) -> tuple[list[int], bool]:
        """Held-out sequences for evaluation: the greedy answers (where T = 0 teacher
        forcing is exact) when there are any; (indices, greedy only)."""
        greedy = [i for i in self.eval_indices if float(self.store.temperatures[i]) == 0.0]
        chosen = greedy or list(self.eval_indices)
        return chosen[:self.config.max_eval_sequences], bool(greedy)

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """Held-out loss, accuracy per block position and acceptance (module docstring of
        ddtree.training.evaluation): `tau` linear T = 0, `tau_tree` tree@eval_tree_budget
        T = 0, `tau_t1_lower` a lower bound of linear at T = 1. Fixed anchors, so two
        evaluations of the same drafter agree."""
        indices, greedy_only = self.eval_sequences()
        self.drafter.eval()
        loss_sum, num_batches, corrects, keeps, trees, sampled = 0.0, 0, [], [], [], []
        for begin in range(0, len(indices), self.config.batch_size):
            chunk = [self.store.get(i) for i in indices[begin:begin + self.config.batch_size]]
            generator = torch.Generator().manual_seed(10_007 + begin)
            batch = make_batch(chunk, self.config.block_size, self.config.num_anchors,
                               generator, self.device)
            loss, metrics, final = self.batch_loss(batch)
            loss_sum, num_batches = loss_sum + float(loss), num_batches + 1
            keep = metrics["keep"]
            corrects.append(metrics["correct"].flatten(0, 1).cpu())
            keeps.append(keep.flatten(0, 1).cpu())
            sampled.append(self._sampled_bound(batch, metrics, final))
            if self.config.eval_tree_budget:
                trees.append(self._tree_tau(batch, metrics["hidden"], keep))
        self.drafter.train()
        if not num_batches:
            return {}
        summary = summarize(torch.cat(corrects)[None], torch.cat(keeps)[None])
        out = {"loss": round(loss_sum / num_batches, 5), "num_sequences": len(indices),
               "greedy_only": greedy_only, **summary,
               "tau_t1_lower": round(float(torch.cat(sampled).mean()), 4)}
        if trees:
            out[f"tau_tree{self.config.eval_tree_budget}"] = round(
                float(torch.cat(trees).mean()), 4)
        return out

    def _sampled_bound(self, batch: BlockBatch, metrics: dict[str, Tensor],
                       final: Tensor) -> Tensor:
        keep = metrics["keep"]
        blocks = keep[..., 0]  # (B, n)
        drafts = torch.zeros_like(batch.labels)
        drafts[keep] = metrics["logits"].argmax(-1)
        probs = torch.zeros(keep.shape, device=keep.device)
        target = target_logits_at_labels(final, self.embeddings, batch, keep)  # (K, V)
        probs[keep] = torch.softmax(target, -1).gather(1, drafts[keep][:, None])[:, 0]
        return sampled_chain_lower_bound(drafts[blocks], probs[blocks], batch.labels[blocks],
                                         keep[blocks]).cpu()

    def _tree_tau(self, batch: BlockBatch, hidden: Tensor, keep: Tensor,
                  chunk: int = 256) -> Tensor:
        """hidden: (B, n, b-1, H) -> (blocks,) tree acceptance of each real block."""
        blocks = keep[..., 0]  # (B, n)
        hidden = hidden[blocks]  # (K, L, H)
        labels = batch.labels[blocks]  # (K, L)
        bonus = batch.bonus[blocks]
        out = []
        for start in range(0, hidden.shape[0], chunk):
            part = hidden[start:start + chunk].to(self.embeddings.lm_head.weight.dtype)
            logits = self.embeddings.logits(part)  # (k, L, V)
            out.append(tree_acceptance(logits, bonus[start:start + chunk],
                                       labels[start:start + chunk],
                                       self.config.eval_tree_budget).cpu())
        return torch.cat(out) if out else torch.zeros(0)

    def save_state(self) -> None:
        state = {"drafter": self.drafter.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "progress": asdict(self.progress), "best": self.best_state,
                 "config": asdict(self.config)}
        partial = self.train_dir / "state.pt.partial"
        torch.save(state, partial)
        partial.replace(self.train_dir / "state.pt")

    def load_state(self) -> bool:
        """Restores the saved run (weights, optimizer, progress, best weights); False when
        there is none."""
        path = self.train_dir / "state.pt"
        if not path.exists():
            return False
        state = torch.load(path, map_location=self.device, weights_only=True)
        self.drafter.load_state_dict(state["drafter"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.progress = Progress(**state["progress"])
        self.best_state = state["best"]
        return True

    def check(self, log: Any, on_best: Callable[[DFlashDrafter], None] | None) -> None:
        """One held-out evaluation: logged; the best weights kept (and handed to
        `on_best`); the patience count advanced when the gain is below `min_delta`."""
        p, config = self.progress, self.config
        evaluation = self.evaluate()
        tau = float(evaluation.get("tau", 1.0))
        improved = tau > p.best_tau + config.min_delta or p.best_step < 0
        if tau > p.best_tau:
            p.best_tau, p.best_step = tau, p.step
            self.best_state = {k: v.detach().to("cpu", copy=True)
                               for k, v in self.drafter.state_dict().items()}
            self.best_eval = evaluation
            if on_best is not None:
                on_best(self.drafter)
        p.bad_evals = 0 if improved else p.bad_evals + 1
        p.early_stopped = bool(config.patience) and p.bad_evals >= config.patience
        log.write(json.dumps({"step": p.step, "elapsed": round(p.elapsed, 2),
                              "eval": evaluation, "best_tau": round(p.best_tau, 4),
                              "bad_evals": p.bad_evals}) + "\n")
        log.flush()

    def fit(self, resume: bool, progress: bool,
            on_best: Callable[[DFlashDrafter], None] | None = None) -> Progress:
        """Runs steps until the progress fraction reaches 1 or training stops early, then
        leaves the best evaluated weights in `self.drafter`; returns the progress."""
        config = self.config
        resumed = self.load_state() if resume else False
        p = self.progress
        start = time.perf_counter() - p.elapsed
        bar = tqdm(total=config.max_steps, initial=p.step, desc="train drafter", unit="step",
                   disable=not progress)
        with open(self.train_dir / "log.jsonl", "a" if resumed else "w") as log:
            if config.eval_every and p.step == 0:
                self.check(log, on_best)  # the starting point (e.g. the grown checkpoint)
            while not p.early_stopped:
                p.elapsed = time.perf_counter() - start
                budget = p.elapsed / config.max_seconds if config.max_seconds else 0.0
                fraction = max(p.step / config.max_steps, budget)
                if fraction >= 1.0:
                    break
                lr = config.lr * lr_factor(fraction, config.warmup_fraction)
                metrics = self.train_step(p.step, lr, p.step % config.log_every == 0)
                p.step += 1
                bar.update()
                if metrics is not None:
                    record = {"step": p.step, "lr": lr, "elapsed": round(p.elapsed, 2),
                              **metrics}
                    log.write(json.dumps(record) + "\n")
                    log.flush()
                    bar.set_postfix(loss=metrics["loss"], tau=metrics["tau"])
                if config.eval_every and p.step % config.eval_every == 0:
                    self.check(log, on_best)
                if p.step % config.save_every == 0:
                    self.save_state()
            if p.best_step != p.step and not p.early_stopped:
                self.check(log, on_best)  # the final weights, unless just evaluated
        bar.close()
        p.elapsed = time.perf_counter() - start
        self.save_state()
        if self.best_state is not None:
            self.drafter.load_state_dict(self.best_state)
        return p


def train_drafter(target_dir: Path, out_dir: Path, work_dir: Path, config: TrainConfig,
                  device: torch.device, resume: bool = False,
                  progress: bool = True) -> dict[str, Any]:
    """Trains on the response shards in `work_dir`, writes the best bf16 drafter to
    `out_dir` (as soon as it is found, and again at the end) and
    `<work_dir>/train/stats.json`; returns the stats."""
    store = SequenceStore.load(completed_shards(Path(work_dir)))
    if len(store) < 2:
        raise InvalidArgumentError(f"{len(store)} usable responses in {work_dir}/responses: "
                                   "run the generate stage first")
    trainer = Trainer(Path(target_dir), store, Path(work_dir), config, device)

    def write(drafter: DFlashDrafter) -> None:
        save_drafter(copy.deepcopy(drafter).to(torch.bfloat16).eval(), out_dir)

    run = trainer.fit(resume, progress, on_best=write)
    evaluation = trainer.best_eval or trainer.evaluate()
    final = copy.deepcopy(trainer.drafter).to(torch.bfloat16).eval()
    save_drafter(final, out_dir)
    stats = {
        "steps": run.step, "train_seconds": round(run.elapsed, 1),
        "best_step": run.best_step, "early_stopped": run.early_stopped,
        "num_sequences": len(store), "num_train_sequences": len(trainer.train_indices),
        "num_eval_sequences": len(trainer.eval_indices),
        "num_response_tokens": store.num_response_tokens(),
        "drafter_params": sum(p.numel() for p in final.parameters()),
        "drafter_bytes": sum(f.stat().st_size for f in Path(out_dir).iterdir() if f.is_file()),
        "eval": evaluation, "config": asdict(config),
        "drafter_config": final.config.to_hf(),
    }
    (trainer.train_dir / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats
