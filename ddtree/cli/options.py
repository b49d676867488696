"""Command-line options several subcommands share (model pair, device, speculation, sampling)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ddtree.engine import MODES, SpecParams
from ddtree.sampling import SamplingParams

if TYPE_CHECKING:
    from ddtree.models.drafter import DFlashDrafter
    from ddtree.models.target import TargetModel


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", help="target checkpoint dir (default: the demo pair)")
    parser.add_argument("--drafter", help="DFlash drafter checkpoint dir (default: the demo pair)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")


DEFAULT_BUDGET = 32  # tree nodes besides the root


def add_spec_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=MODES, default="auto",
                        help="auto (default): the load-following policy picks ar, the chain "
                             "or a tree size per row from measured acceptance and round "
                             "cost; tree: always a tree of --budget nodes")
    parser.add_argument("--budget", type=int, default=DEFAULT_BUDGET, help="tree node budget")
    parser.add_argument("--max-topk", type=int, default=None, help="branching cap per depth")


def add_sampling_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)


def spec_from_args(args: argparse.Namespace) -> SpecParams:
    return SpecParams(mode=args.mode, budget=args.budget, max_topk=args.max_topk)


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)


def resolve_pair_dirs(
    args: argparse.Namespace, need_drafter: bool = True
) -> tuple[str, str | None]:
    """--target/--drafter, or the demo pair (pulled on first use) when neither is given."""
    if args.target:
        if need_drafter and not args.drafter:
            raise SystemExit("ddtree: --drafter is required with --target (or use --mode ar)")
        return args.target, args.drafter if need_drafter else None
    from ddtree.demo.pull import default_demo_paths, pull_smollm2

    target_dir, drafter_dir = default_demo_paths()
    pull_smollm2(target_dir.parent)
    return str(target_dir), str(args.drafter or drafter_dir) if need_drafter else None


def load_from_args(
    args: argparse.Namespace, need_drafter: bool
) -> tuple[TargetModel, DFlashDrafter | None, Any]:
    """--target/--drafter (or the demo pair), --device, --dtype -> (target, drafter | None,
    the target's tokenizer)."""
    from transformers import AutoTokenizer

    from ddtree.runtime import load_pair, resolve_device, resolve_dtype

    target_dir, drafter_dir = resolve_pair_dirs(args, need_drafter=need_drafter)
    device = resolve_device(args.device)
    target, drafter = load_pair(target_dir, drafter_dir, device, resolve_dtype(args.dtype, device))
    return target, drafter, AutoTokenizer.from_pretrained(target_dir)
