"""Issue 12 in one GPU call: the target's answers from the batched engine, then a bigger
drafter trained from the committed one, under one hard deadline (run via lease_drafter.sh).

  prompts   built from this host's Python installation (never benchmark prompts)
  generate  ar mode, hundreds of rows, CUDA graphs, answers up to --max-new-tokens, for
            --gen-seconds (or less, so that training keeps --min-train-seconds)
  train     --shape (grown from --init-from when given), for --train-seconds or what the
            deadline leaves; held-out acceptance every --eval-every steps, early stop
  out       $OUT/drafter/ (config.json, <= 16 MiB safetensors shards, index), the new token
            data as $OUT/data/tokens-NNNNN.npz (<= 16 MiB each), $OUT/train_log.jsonl,
            $OUT/report.json: at most 8 files. The best drafter is written as soon as an
            evaluation finds it and the data right after generation, so a call cut short
            still returns both. A copy of the drafter stays in --keep-drafter for the
            acceptance-table call (`lease_drafter.sh table`).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ddtree.models.drafter import DFlashDrafter, save_drafter
from ddtree.models.target import load_target
from ddtree.training import recipe, shards
from ddtree.training.data import SequenceStore
from ddtree.training.engine_responses import EngineGenConfig, generate_with_engine
from ddtree.training.prompts import PromptConfig
from ddtree.training.responses import completed_shards
from ddtree.training.trainer import TrainConfig, Trainer

# Drafter shapes (models/smollm2-135m-dflash/README.md says why "big"): layers, MLP width,
# target layers (None: z-lab's spacing, (1, 8, 14, 20, 27) for 5 layers of 30).
SHAPES: dict[str, dict[str, Any]] = {
    "big": {"num_layers": 5, "intermediate_size": 1024, "target_layer_ids": None},
    "current": {"num_layers": 2, "intermediate_size": 640, "target_layer_ids": (1, 14, 27)},
}
MAX_OUT_FILES = 8
DRAFTER_FILES = 4  # config.json, two weight shards, the index (32 MiB cap, 16 MiB files)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/ddtree-drafter-work"))
    p.add_argument("--keep-drafter", type=Path, default=Path("/tmp/ddtree-drafter-new"))
    p.add_argument("--start", type=float, default=None, help="epoch seconds the call began")
    p.add_argument("--total-seconds", type=float, default=540.0, help="hard deadline")
    p.add_argument("--final-reserve", type=float, default=30.0,
                   help="seconds kept after training for the last evaluation and writing")
    p.add_argument("--num-prompts", type=int, default=24_000)
    p.add_argument("--gen-seconds", type=float, default=150.0)
    p.add_argument("--gen-seqs", type=int, default=512, help="engine rows at once")
    p.add_argument("--max-new-tokens", type=int, default=1024)
    p.add_argument("--data-in", type=Path, default=None, help="carried token packs (*.npz)")
    p.add_argument("--train-seconds", type=float, default=330.0)
    p.add_argument("--min-train-seconds", type=float, default=120.0)
    p.add_argument("--shape", choices=sorted(SHAPES), default="big")
    p.add_argument("--num-layers", type=int, default=None, help="overrides the shape's")
    p.add_argument("--intermediate-size", type=int, default=None, help="overrides the shape's")
    p.add_argument("--target-layer-ids", default=None, help="comma list; overrides the shape's")
    p.add_argument("--device", default="cuda", help="cuda (cpu: a smoke test on a tiny pair)")
    p.add_argument("--init-from", default="models/smollm2-135m-dflash",
                   help="drafter checkpoint to start from ('none': random)")
    p.add_argument("--resume", action="store_true",
                   help="continue <work-dir>/train/state.pt (a warm machine's earlier call)")
    p.add_argument("--kl-weight", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--num-anchors", type=int, default=32)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--patience", type=int, default=5)
    return p.parse_args(argv)


class Clock:
    def __init__(self, start: float, total: float) -> None:
        self.start, self.deadline = start, start + total

    def left(self) -> float:
        return self.deadline - time.time()

    def now(self) -> float:
        return round(time.time() - self.start, 1)


def generate(args: argparse.Namespace, clock: Clock, report: dict[str, Any]) -> None:
    """Prompts, then the engine's answers; the new shards go to $OUT/data at once."""
    report["prompts"] = recipe.prompts_stage(
        args.target, args.work_dir,
        PromptConfig(num_prompts=args.num_prompts, include_site_packages=True))
    report["prompts"]["done_at_s"] = clock.now()
    if args.data_in is not None:
        report["carried_packs"] = [p.name for p in shards.import_packs(args.data_in,
                                                                       args.work_dir)]
    budget = min(args.gen_seconds,
                 clock.left() - args.min_train_seconds - args.final_reserve)
    if budget < 15:
        report["generate"] = {"skipped": f"{budget:.0f} s left for generation"}
        return
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = load_target(args.target, device, dtype)
    stops, _ = recipe.stop_and_pad_ids(args.target)
    config = EngineGenConfig(max_new_tokens=args.max_new_tokens, max_num_seqs=args.gen_seqs,
                             max_seconds=budget, cuda_graphs=device.type == "cuda")
    stats = generate_with_engine(target, recipe.load_prompt_ids(args.work_dir),
                                 args.work_dir, config, stops)
    del target
    gc.collect()  # the engine (KV pool, graphs) may sit in reference cycles
    if device.type == "cuda":
        torch.cuda.empty_cache()
    max_files = MAX_OUT_FILES - DRAFTER_FILES - 2  # train_log.jsonl and report.json
    stats["export"] = shards.export_packs(args.work_dir, args.out / "data", max_files,
                                          pattern="shard-*.npz")
    stats["done_at_s"] = clock.now()
    report["generate"] = stats


def write_drafter(drafter: DFlashDrafter, dest: Path) -> None:
    """The bf16 drafter into `dest`, swapped in whole (a cut call never leaves half)."""
    staging, old = dest.with_name(dest.name + ".new"), dest.with_name(dest.name + ".old")
    shutil.rmtree(staging, ignore_errors=True)
    bf16 = DFlashDrafter(drafter.config)
    bf16.load_state_dict(drafter.state_dict())
    save_drafter(bf16.to(torch.bfloat16).eval(), staging)
    if dest.exists():
        dest.rename(old)
    staging.rename(dest)
    shutil.rmtree(old, ignore_errors=True)


def shape(args: argparse.Namespace) -> dict[str, Any]:
    chosen = dict(SHAPES[args.shape])
    if args.num_layers is not None:
        chosen["num_layers"] = args.num_layers
    if args.intermediate_size is not None:
        chosen["intermediate_size"] = args.intermediate_size
    if args.target_layer_ids:
        chosen["target_layer_ids"] = tuple(int(i) for i in args.target_layer_ids.split(","))
    return chosen


def train(args: argparse.Namespace, clock: Clock, report: dict[str, Any]) -> None:
    store = SequenceStore.load(completed_shards(args.work_dir))
    if len(store) < 8:
        report["train"] = {"skipped": f"{len(store)} usable answers"}
        return
    init_from = None if args.init_from == "none" else args.init_from
    config = TrainConfig(**shape(args), block_size=16, num_anchors=args.num_anchors,
                         batch_size=args.batch_size, lr=args.lr, max_steps=10_000_000,
                         log_every=20, save_every=10**9, eval_every=args.eval_every,
                         patience=args.patience, max_eval_sequences=128,
                         eval_fraction=0.02, kl_weight=args.kl_weight, init_from=init_from)
    trainer = Trainer(args.target, store, args.work_dir, config, torch.device(args.device))
    budget = min(args.train_seconds, clock.left() - args.final_reserve)
    # A resumed run's clock includes the earlier call's seconds: this call adds `budget`.
    before = trainer.progress.elapsed if args.resume and trainer.load_state() else 0.0
    trainer.config = dataclasses.replace(config, max_seconds=before + max(budget, 1.0))
    drafter_dir = args.out / "drafter"
    run = trainer.fit(resume=args.resume, progress=False,
                      on_best=lambda d: write_drafter(d, drafter_dir))
    write_drafter(trainer.drafter, drafter_dir)  # the best weights (fit restored them)
    shutil.copy2(trainer.train_dir / "log.jsonl", args.out / "train_log.jsonl")
    shutil.rmtree(args.keep_drafter, ignore_errors=True)
    shutil.copytree(drafter_dir, args.keep_drafter)
    report["train"] = {
        "steps": run.step, "seconds": round(run.elapsed, 1), "best_step": run.best_step,
        "early_stopped": run.early_stopped, "best_eval": trainer.best_eval,
        "num_sequences": len(store), "num_train_sequences": len(trainer.train_indices),
        "num_eval_sequences": len(trainer.eval_indices),
        "num_response_tokens": store.num_response_tokens(),
        "drafter_params": sum(p.numel() for p in trainer.drafter.parameters()),
        "drafter_files": {f.name: f.stat().st_size for f in sorted(drafter_dir.iterdir())},
        "config": dataclasses.asdict(trainer.config), "done_at_s": clock.now()}


def write_report(args: argparse.Namespace, report: dict[str, Any]) -> None:
    partial = args.out / "report.json.partial"
    partial.write_text(json.dumps(report, indent=1, default=str) + "\n")
    os.replace(partial, args.out / "report.json")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    clock = Clock(args.start or time.time(), args.total_seconds)
    args.out.mkdir(parents=True, exist_ok=True)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    report: dict[str, Any] = {"args": vars(args), "device": device}
    try:
        generate(args, clock, report)
        write_report(args, report)
        train(args, clock, report)
    finally:
        report["total_s"] = clock.now()
        write_report(args, report)
        files = sorted(p for p in args.out.rglob("*") if p.is_file())
        print(json.dumps({k: report.get(k) for k in ("generate", "train", "total_s")},
                         indent=1, default=str))
        print(f"{len(files)} files under $OUT: " + ", ".join(
            f"{p.relative_to(args.out)} ({p.stat().st_size})" for p in files))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
