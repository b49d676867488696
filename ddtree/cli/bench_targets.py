"""`ddtree bench` flags -> the targets it runs (the server at --url or the engine
in-process, then the hf and --baseline-url baselines) and the encoded prompt sets."""

from __future__ import annotations

import argparse
from typing import Any

from ddtree.benchmark.client_pool import ClientPool
from ddtree.benchmark.config import HF_MODE, SERVER_MODE, BenchConfig, LoadPoint, SpecPoint
from ddtree.benchmark.inprocess import InProcessTarget
from ddtree.benchmark.openai_target import OpenAITarget
from ddtree.benchmark.runner import TargetPlan
from ddtree.benchmark.sample import BenchPrompt
from ddtree.benchmark.workload import Encoder, PromptSources, prompt_sets
from ddtree.cli.generate import encode_prompt
from ddtree.cli.options import load_from_args, resolve_pair_dirs


def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


async def _server(args: argparse.Namespace, url: str, name: str,
                  model: str | None) -> OpenAITarget | ClientPool:
    target = OpenAITarget(url, name, model, args.api_key, args.timeout, args.extra_body)
    await target.start()
    if args.client_processes > 1:
        return ClientPool(target, args.client_processes)
    return target


def _hf_plan(args: argparse.Namespace, tokenizer: Any | None) -> tuple[TargetPlan, Any]:
    from ddtree.benchmark.hf_baseline import HFTarget
    from ddtree.runtime import resolve_device, resolve_dtype

    target_dir, _ = resolve_pair_dirs(args, need_drafter=False)
    tokenizer = tokenizer or _tokenizer(target_dir)
    device = resolve_device(args.device)
    hf = HFTarget(target_dir, device, resolve_dtype(args.dtype, device), tokenizer,
                  args.baseline_compile)
    return TargetPlan(hf, [SpecPoint(HF_MODE)], [LoadPoint(1)]), tokenizer


def _encoder(tokenizer: Any, is_chat: bool) -> Encoder:
    def encode(text: str) -> list[int]:
        return encode_prompt(tokenizer, None if is_chat else text, text if is_chat else None)

    return encode


async def build_plans(args: argparse.Namespace, config: BenchConfig, sources: PromptSources
                      ) -> tuple[list[TargetPlan], dict[str, list[BenchPrompt]]]:
    """The hf baseline runs at concurrency 1 only (it generates one request at a time)."""
    plans: list[TargetPlan] = []
    tokenizer = None
    if args.url:
        plans.append(TargetPlan(await _server(args, args.url, "url", args.model),
                                config.specs, config.loads))
        if args.tokenizer or args.target:
            tokenizer = _tokenizer(args.tokenizer or args.target)
    else:
        need_drafter = any(spec.mode != "ar" for spec in config.specs)
        target, drafter, tokenizer = load_from_args(args, need_drafter=need_drafter)
        plans.append(TargetPlan(InProcessTarget(target, drafter, tokenizer),
                                config.specs, config.loads))
    if args.baseline == "hf":
        hf_plan, tokenizer = _hf_plan(args, tokenizer)
        plans.append(hf_plan)
    if args.baseline_url:
        baseline = await _server(args, args.baseline_url, "baseline-url", args.baseline_model)
        plans.append(TargetPlan(baseline, [SpecPoint(SERVER_MODE)], config.loads))
    is_encoded = not args.url or args.baseline == "hf"
    encoder = _encoder(tokenizer, sources.is_chat) if is_encoded else None
    return plans, prompt_sets(sources, tokenizer, encoder)
