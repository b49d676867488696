"""The demo drafter's training job on a lent GPU host (run through train_demo.sh).

Stages (comma-separated `--stage`, state in `--work-dir`, so the job splits over calls):
  convert   join the GGUF halves, check sha256, dequantise to a safetensors target, build
            and tokenize the training prompts from this host's Python installation
  generate  the target's own responses (transformers, bf16), until --gen-seconds
  train     the drafter (shape: docs/demo-drafter.md), until --train-seconds
Everything that comes back lands in --out: the drafter (config.json, model.safetensors),
train_log.jsonl and stats.json, each well under 16 MiB.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ddtree.demo.pull import DEMO_DRAFTER_NAME, GGUF_NAME, TARGET_NAME, pull_smollm2, verify_gguf
from ddtree.training import recipe
from ddtree.training.prompts import PromptConfig
from ddtree.training.responses import ResponseConfig, completed_shards
from ddtree.training.trainer import TrainConfig

# The demo drafter's shape and recipe; docs/demo-drafter.md says why.
DEMO_TRAIN = TrainConfig(num_layers=2, intermediate_size=640, target_layer_ids=(1, 14, 27),
                         block_size=16, num_anchors=32, batch_size=32, lr=6e-4,
                         max_steps=100_000, log_every=20, save_every=500)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", default="convert,generate,train",
                        help="comma-separated subset of convert,generate,train")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/ddtree-work"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gguf-part", type=Path, action="append", default=[],
                        help="a piece of the GGUF, in order (repeat); or the whole file")
    parser.add_argument("--num-prompts", type=int, default=40_000)
    parser.add_argument("--gen-seconds", type=float, default=240.0)
    parser.add_argument("--gen-batch-size", type=int, default=1024)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--train-seconds", type=float, default=360.0)
    parser.add_argument("--resume", action="store_true", help="continue an interrupted train")
    parser.add_argument("--export-responses", action="store_true",
                        help="also copy the response shards to --out/responses")
    parser.add_argument("--quiet", action="store_true")
    return parser.parse_args(argv)


def join_gguf(parts: list[Path], dest: Path) -> Path:
    """Concatenates the carried pieces into `dest` and checks the sha256 of the whole."""
    if not parts:
        raise SystemExit("convert: pass the GGUF with --gguf-part (once per piece, in order)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as out:
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, out, length=1 << 22)
    verify_gguf(dest)
    return dest


def convert(args: argparse.Namespace, target_dir: Path) -> dict[str, Any]:
    start = time.perf_counter()
    if not (target_dir / ".ddtree-complete").exists():
        gguf = join_gguf(args.gguf_part, args.work_dir / GGUF_NAME)
        pull_smollm2(target_dir.parent, progress=not args.quiet, gguf=gguf)
        gguf.unlink()
    converted = round(time.perf_counter() - start, 1)
    prompts = recipe.prompts_stage(
        target_dir, args.work_dir,
        PromptConfig(num_prompts=args.num_prompts, include_site_packages=True))
    return {"convert_seconds": converted, **prompts,
            "prompt_seconds": round(time.perf_counter() - start - converted, 1)}


def generate(args: argparse.Namespace, target_dir: Path) -> dict[str, Any]:
    config = ResponseConfig(max_new_tokens=args.max_new_tokens, batch_size=args.gen_batch_size,
                            shard_size=2 * args.gen_batch_size, max_seconds=args.gen_seconds)
    stats = recipe.generate_stage(target_dir, args.work_dir, config, device(),
                                  progress=not args.quiet)
    if args.export_responses:
        (args.out / "responses").mkdir(parents=True, exist_ok=True)
        for shard in completed_shards(args.work_dir):
            shutil.copy2(shard, args.out / "responses" / shard.name)
    return stats


def train(args: argparse.Namespace, target_dir: Path) -> dict[str, Any]:
    drafter_dir = args.out / DEMO_DRAFTER_NAME
    config = dataclasses.replace(DEMO_TRAIN, max_seconds=args.train_seconds)
    stats = recipe.train_stage(target_dir, drafter_dir, args.work_dir, config, device(),
                               resume=args.resume, progress=not args.quiet)
    shutil.copy2(args.work_dir / "train" / "log.jsonl", args.out / "train_log.jsonl")
    return stats


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def print_summary(report: dict[str, Any]) -> None:
    rows = []
    if "convert" in report:
        c = report["convert"]
        rows += [("convert (s)", c["convert_seconds"]), ("prompts", c["num_prompts"]),
                 ("prompt sources", ", ".join(f"{k} {v}" for k, v in c["by_source"].items()))]
    if "generate" in report:
        g = report["generate"]
        rows += [("responses", g["num_sequences"]), ("response tokens", g["num_response_tokens"]),
                 ("mean response tokens", g["mean_response_tokens"]),
                 ("ended with <|im_end|>", g["ended_with_eos"]), ("generate (s)", g["seconds"])]
    if "train" in report:
        t, e = report["train"], report["train"].get("eval", {})
        rows += [("train steps", t["steps"]), ("train (s)", t["train_seconds"]),
                 ("eval loss", e.get("loss")), ("eval acc@1", e.get("acc1")),
                 ("eval tau (chain, greedy)", e.get("tau")),
                 ("drafter params", t["drafter_params"]), ("drafter bytes", t["drafter_bytes"])]
    width = max(len(name) for name, _ in rows) if rows else 0
    print("\n" + "\n".join(f"{name:<{width}}  {value}" for name, value in rows))


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    stages = [s.strip() for s in args.stage.split(",") if s.strip()]
    unknown = set(stages) - {"convert", "generate", "train"}
    if unknown:
        raise SystemExit(f"unknown stage(s): {sorted(unknown)}")
    args.out.mkdir(parents=True, exist_ok=True)
    target_dir = args.work_dir / "cache" / TARGET_NAME
    if "convert" not in stages and not (target_dir / ".ddtree-complete").exists():
        stages.insert(0, "convert")  # a fresh machine: the target must exist first
    report: dict[str, Any] = {}
    for stage in ("convert", "generate", "train"):
        if stage in stages:
            report[stage] = {"convert": convert, "generate": generate,
                             "train": train}[stage](args, target_dir)
    stats_path = args.out / "stats.json"
    previous = json.loads(stats_path.read_text()) if stats_path.exists() else {}
    stats_path.write_text(json.dumps({**previous, **report}, indent=2, default=str) + "\n")
    print_summary(report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
