"""`ddtree models ...`: checkpoints for tests and demos.

`ddtree models make-tiny DIR [--family llama|qwen3] [--seed S]` writes a tiny random target
and DFlash drafter (DIR/target, DIR/drafter) in the real formats; `ddtree models pull` (the
demo target) is registered by `ddtree.demo.pull` when that module is installed.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("models", help="make or fetch model checkpoints")
    models_sub = parser.add_subparsers(dest="models_command", required=True)
    tiny = models_sub.add_parser(
        "make-tiny", help="write a tiny random target + DFlash drafter pair (CPU tests, demos)")
    tiny.add_argument("dir", type=Path, help="output folder (gets target/ and drafter/)")
    tiny.add_argument("--family", choices=("llama", "qwen3"), default="llama",
                      help="target architecture (llama: tied embeddings + mask_embedding; "
                           "qwen3: q/k norms + mask_token_id)")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(func=run_make_tiny)
    # `pull` lives with the demo download code; skipped where that module is absent.
    if importlib.util.find_spec("ddtree.demo.pull") is not None:
        from ddtree.demo.pull import add_pull_parser

        add_pull_parser(models_sub)


def run_make_tiny(args: argparse.Namespace) -> int:
    from ddtree.models.tiny import make_tiny_pair  # torch + transformers: import on use

    target_dir, drafter_dir = make_tiny_pair(args.dir, family=args.family, seed=args.seed)
    print(f"target:  {target_dir}")
    print(f"drafter: {drafter_dir}")
    return 0
