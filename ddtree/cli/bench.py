"""`ddtree bench`: the four modes side by side, in one process, on the same prompts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ddtree.bench import bench, format_table
from ddtree.cli.generate import encode_prompt
from ddtree.cli.options import (
    add_model_options,
    add_sampling_options,
    load_from_args,
    sampling_from_args,
)
from ddtree.engine import MODES, SpecParams
from ddtree.prompts import load_prompts


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="benchmark modes side by side (in-process)")
    add_model_options(parser)
    add_sampling_options(parser)
    parser.add_argument("--prompts", nargs="+", required=True,
                        help="JSONL prompt files (FastChat `turns`, HumanEval `prompt`, .gz ok)")
    parser.add_argument("--num-prompts", type=int, default=None, help="first N of each file")
    parser.add_argument("--modes", default="ar,linear,tree,shadow")
    parser.add_argument("--budgets", default="32", help="comma list, for tree and shadow")
    parser.add_argument("--max-topk", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--raw", action="store_true", help="no chat template around prompts")
    parser.add_argument("--json-out", help="write every row (and token ids) to this file")
    parser.set_defaults(func=run)


def specs_from_args(args: argparse.Namespace) -> list[SpecParams]:
    specs = []
    for mode in args.modes.split(","):
        if mode not in MODES:
            raise SystemExit(f"ddtree bench: unknown mode {mode!r}")
        budgets = [int(b) for b in args.budgets.split(",")] if mode in ("tree", "shadow") else [0]
        specs += [SpecParams(mode, max(b, 1), args.max_topk) for b in budgets]  # type: ignore[arg-type]
    return specs


def run(args: argparse.Namespace) -> int:
    specs = specs_from_args(args)
    need_drafter = any(s.mode != "ar" for s in specs)
    target, drafter, tokenizer = load_from_args(args, need_drafter=need_drafter)
    prompt_sets = {}
    for path in args.prompts:
        texts = load_prompts(path, args.num_prompts)
        prompt_sets[Path(path).name.split(".")[0]] = [
            encode_prompt(tokenizer, text if args.raw else None, None if args.raw else text)
            for text in texts
        ]
    rows = bench(target, drafter, prompt_sets, specs, sampling_from_args(args), args.max_tokens,
                 args.warmup)
    print(format_table(rows))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(
            [row.to_dict() | {"token_ids": row.token_ids} for row in rows]))
    return 0
