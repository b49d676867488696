"""The engine on a GPU, measured the way a user would run it, in one process.

Stages (comma list, `--stages`):
  exact     every mode x budget on HumanEval (chat template, T=0) at concurrency 1 and 8,
            bf16 with batch-invariant kernels: tokens compared with ar's (and the speeds)
  speed     tok/s per mode at batch 1 side by side: ar, linear, tree@{15,16,32,64},
            shadow@64, plus variants (`--speed-variants`): ar with the generic tree walk,
            ar / tree@32 without the SwiGLU epilogue, modes with the norms after o_proj /
            down on their own (no reduce fusions), without dependent launches (no PDL),
            without their L2 prefetches (no prefetch) or with the fused norm/SwiGLU
            prologues, linear / tree@32 / tree@64 with the trees built in PyTorch instead
            of one kernel (PyTorch tree), tree@16 / tree@32 with torch.topk for the
            drafter's vocabulary top-K (torch top-K), ar / tree@64 with the batch-invariant
            GEMMs off (cuBLAS); and
            transformers' static-cache `generate` on the same prompts
  fp32      the same exactness check in float32 (fewer modes)
  load      total throughput at concurrency 1/8/32/64 for ar, tree@16, tree@64 and auto,
            all requests at once (the batch drains as rows finish): each point run twice,
            cold (graphs captured, auto measuring) then warm (the row without /cold)
  autoseq   `auto` one request after another: each one's tau and final policy state
  acceptance  the acceptance table: every held-out set x T in {0, 1} x linear and tree
            budgets 8..128 in one process ($OUT/acceptance.md)
  profile   where a round's time goes at batch 1 and 8 (ar, tree@16, tree@32): wall time per
            round against the draft / verify halves' GPU time (CUDA events), and the top
            kernels of a torch.profiler trace (text tables under $OUT)
  shapes8b  a Qwen3-8B-shaped target + z-lab-8B-shaped drafter (random bf16 weights built
            on the GPU): ar step vs the weight-read floor, verify of 1+63 nodes, one draft
            block, copy bandwidth measured in the same run
  profile8b the 8B shapes' kernels: Chrome traces of ar steps and tree@63 rounds
Writes `$OUT/engine_<stage>.json` and prints one table per stage.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ddtree.benchmark.inprocess import warmed_up
from ddtree.engine import EngineConfig, GenerationRequest, SpecParams
from ddtree.engine.drafting import LocalDrafter
from ddtree.engine.generate import build_engine
from ddtree.kernels.launch import set_pdl, set_prefetch
from ddtree.kernels.tree_attention import set_query_groups, set_wide_stages
from ddtree.kernels.vocab_topk import set_shapes as set_topk_shapes
from ddtree.models.drafter import DFlashDrafter, DrafterConfig
from ddtree.models.target import TargetModel
from ddtree.models.target_config import TargetConfig
from ddtree.runtime import load_pair
from ddtree.sampling import SamplingParams
from ddtree.tree import set_fused_lse

OUT = Path(os.environ.get("OUT", "/tmp/out"))
SPECS = {
    "ar": SpecParams("ar"), "linear": SpecParams("linear"),
    "tree@15": SpecParams("tree", 15), "tree@15k8": SpecParams("tree", 15, 8),
    "tree@16": SpecParams("tree", 16), "tree@32": SpecParams("tree", 32),
    "tree@64": SpecParams("tree", 64), "tree@128": SpecParams("tree", 128),
    "shadow@16": SpecParams("shadow", 16), "shadow@64": SpecParams("shadow", 64),
    "auto": SpecParams("auto"),
}


def humaneval_prompts(path: Path, tokenizer: Any, count: int) -> list[list[int]]:
    with gzip.open(path, "rt") as f:
        problems = [json.loads(line)["prompt"] for line in f][:count]
    out = []
    for text in problems:
        chat = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}],
            tokenize=False, add_generation_prompt=True)
        out.append(list(tokenizer(chat, add_special_tokens=False)["input_ids"]))
    return out


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class RoundEnds:
    """Bench instrumentation (a context manager around a run): a timing event recorded on
    the stream right after each round the engine enqueues (its graph and its output copy),
    so the device time a round takes in steady state, gaps between rounds included, is
    read without the pipeline's fill and drain. A pipelined run of n tokens launches n
    rounds for n - 1 tokens after the prefill's: the round that produced the first of them
    overlaps the first step, and one more round runs after the last token (its output
    dropped); `decode_s / (rounds - 1)` charged both to the steady rounds (8B ar, 64
    tokens: ~1.5 rounds over 62, ~2.4%)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.events: list[Any] = []

    def __enter__(self) -> RoundEnds:
        launch = self.engine._launch

        def recorded(*args: Any, **kwargs: Any) -> Any:
            flight = launch(*args, **kwargs)
            if torch.cuda.is_available():
                event = torch.cuda.Event(enable_timing=True)
                event.record()
                self.events.append(event)
            return flight

        self.engine._launch = recorded
        return self

    def __exit__(self, *exc: object) -> None:
        del self.engine._launch  # the class's method again

    def steady_ms(self) -> float | None:
        """Mean device time a round from the end of the first round to the end of the last
        round that produced tokens (the last launched is the dropped one); after a sync."""
        ends = self.events[:-1]
        if len(ends) < 3:
            return None
        return ends[0].elapsed_time(ends[-1]) / (len(ends) - 1)


def run_batch(engine: Any, prompts: list[list[int]], spec: SpecParams, max_tokens: int,
              sampling: SamplingParams | None = None) -> dict[str, Any]:
    """All prompts submitted at once; -> tokens per prompt, wall time (prefill included),
    decode time (after the first step), rounds and per-stage seconds (summed over rows).
    A seeded `sampling` gives prompt i the seed `sampling.seed + i`."""
    for i, prompt in enumerate(prompts):
        mine = sampling or SamplingParams()
        if mine.seed is not None:
            mine = dataclasses.replace(mine, seed=mine.seed + i)
        engine.add_request(f"p{i}", GenerationRequest(prompt, max_tokens, mine, spec,
                                                      ignore_eos=True))
    tokens: dict[str, list[int]] = {f"p{i}": [] for i in range(len(prompts))}
    taus: list[float] = []
    rounds, stages = 0, {"draft": 0.0, "verify": 0.0}
    sync()
    start = time.perf_counter()
    first_done = None
    while engine.has_work:
        for request_id, result in engine.step():
            tokens[request_id] += result.new_tokens
            if result.finished and result.stats is not None:
                taus.append(result.stats.mean_acceptance_length)
                rounds += result.stats.num_rounds
                for stage in stages:
                    stages[stage] += result.stats.stage_seconds.get(stage, 0.0)
        if first_done is None:
            first_done = time.perf_counter()
    sync()
    wall = time.perf_counter() - start
    return {"tokens": [tokens[f"p{i}"] for i in range(len(prompts))], "wall_s": wall,
            "decode_s": wall - ((first_done or start) - start),
            "num_tokens": sum(len(t) for t in tokens.values()), "rounds": rounds,
            "stages": stages, "tau": sum(taus) / max(len(taus), 1)}


def sequential(engine: Any, prompts: list[list[int]], spec: SpecParams,
               max_tokens: int) -> dict[str, Any]:
    """One request at a time (concurrency 1): tok/s = tokens / wall time, prefill included
    (as transformers' generate is timed)."""
    results = [run_batch(engine, [p], spec, max_tokens) for p in prompts]
    return {"tokens": [r["tokens"][0] for r in results],
            "tok_s": sum(r["num_tokens"] for r in results) / sum(r["wall_s"] for r in results),
            "tau": sum(r["tau"] for r in results) / len(results)}


def stage_exact(args: argparse.Namespace, dtype: torch.dtype = torch.bfloat16,
                names: tuple[str, ...] = ("ar", "linear", "tree@16", "tree@64", "shadow@16",
                                          "shadow@64", "tree@15k8", "auto")) -> dict[str, Any]:
    target, drafter, tokenizer = load(args, dtype)
    prompts = humaneval_prompts(args.humaneval, tokenizer, args.num_prompts)
    engine = build_engine(target, drafter, EngineConfig(max_num_seqs=16, max_model_len=2048))
    set_attention_tiles(engine, args.target_attn_tiles, args.drafter_attn_tiles)
    sequential(engine, prompts[:1], SPECS["tree@64"], 16)  # warm-up: kernels and graphs
    rows: dict[str, Any] = {}
    reference = None
    if args.exact_modes and dtype == torch.bfloat16:
        names = tuple(args.exact_modes.split(","))
    for name in names:
        for concurrency in (1, 8):
            batch = prompts * (8 // len(prompts) + 1)
            if concurrency == 1:
                run = sequential(engine, prompts, SPECS[name], args.max_tokens)
            elif len(prompts) <= 8:
                run = run_batch(engine, batch[:8], SPECS[name], args.max_tokens)
            else:  # every prompt, 8 at a time
                runs = [run_batch(engine, prompts[i:i + 8], SPECS[name], args.max_tokens)
                        for i in range(0, len(prompts), 8)]
                run = {"tokens": [t for r in runs for t in r["tokens"]],
                       "tau": sum(r["tau"] for r in runs) / len(runs)}
            got = run["tokens"][: len(prompts)]
            if reference is None:
                reference = got
            same = [a == b for a, b in zip(got, reference, strict=True)]
            rows[f"{name}/c{concurrency}"] = {"same_as_ar": sum(same), "of": len(same),
                                              "tau": round(run["tau"], 3),
                                              "first_diff": first_diff(got, reference)}
            print(f"{name:>10} c{concurrency}: ={sum(same)}/{len(same)} tau {run['tau']:.2f}",
                  flush=True)
    return rows


def set_attention_tiles(engine: Any, target_tiles: str, drafter_tiles: str) -> None:
    """Another tree-attention tiling ("BLOCK_N/warps/stages") for the target and/or the
    drafter, before any graph is captured (the drafter's tiling changes only its trees, so
    setting the two apart tells a tiling that breaks the kernel's invariance from trees the
    engine mishandles: lease 16)."""
    def parse(text: str) -> tuple[int, int, int]:
        block, warps, stages = (int(v) for v in text.split("/"))
        return block, warps, stages

    if target_tiles:
        engine.target.backend = dataclasses.replace(engine.target.backend,
                                                    attn_tiles=parse(target_tiles))
    if drafter_tiles and isinstance(engine.drafting, LocalDrafter):
        engine.drafting.backend = dataclasses.replace(engine.drafting.backend,
                                                      attn_tiles=parse(drafter_tiles))


def stage_exact_sets(args: argparse.Namespace) -> dict[str, Any]:
    """exact over the spec-bench prompt sets (FastChat `turns` JSONL, first turn, chat
    template): every mode x budgets 16 / 64 x concurrency 1 / 8 against ar at c1."""
    target, drafter, tokenizer = load(args, torch.bfloat16)
    engine = build_engine(target, drafter, EngineConfig(max_num_seqs=16, max_model_len=4096))
    rows: dict[str, Any] = {}
    for path in sorted(args.spec_bench.glob("*.jsonl")):
        prompts = spec_bench_prompts(path, tokenizer, args.num_prompts)
        reference = run_batch(engine, prompts[:1], SPECS["ar"], 8)  # warm-up
        reference = sequential(engine, prompts, SPECS["ar"], args.max_tokens)["tokens"]
        for name in ("linear", "tree@16", "tree@64", "shadow@16", "shadow@64"):
            for concurrency in (1, 8):
                run = (sequential(engine, prompts, SPECS[name], args.max_tokens)
                       if concurrency == 1 else
                       run_batch(engine, prompts, SPECS[name], args.max_tokens))
                same = sum(a == b for a, b in zip(run["tokens"], reference, strict=True))
                rows[f"{path.stem}/{name}/c{concurrency}"] = {
                    "same_as_ar": same, "of": len(prompts), "tau": round(run["tau"], 3)}
                print(f"{path.stem:>9} {name:>9} c{concurrency}: ={same}/{len(prompts)} "
                      f"tau {run['tau']:.2f}", flush=True)
    return rows


def spec_bench_prompts(path: Path, tokenizer: Any, count: int) -> list[list[int]]:
    """A spec-bench set (FastChat `turns` JSONL): the first turns of its first `count`
    rows in the chat template."""
    turns = [json.loads(line)["turns"][0] for line in path.read_text().splitlines()]
    prompts = []
    for text in turns[:count]:
        chat = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                             tokenize=False, add_generation_prompt=True)
        prompts.append(list(tokenizer(chat, add_special_tokens=False)["input_ids"])[-3000:])
    return prompts


def stage_acceptance(args: argparse.Namespace) -> dict[str, Any]:
    """The acceptance table in one process (one engine, graphs captured once): every
    held-out set (the spec-bench sets and HumanEval) x T in --temperatures x linear and
    tree at budgets 8..128, the set's prompts in one batch; -> $OUT/acceptance.md."""
    target, drafter, tokenizer = load(args, torch.bfloat16)
    engine = build_engine(target, drafter, EngineConfig(max_num_seqs=16, max_model_len=4096))
    sets = {path.stem: spec_bench_prompts(path, tokenizer, args.num_prompts)
            for path in sorted(args.spec_bench.glob("*.jsonl"))}
    sets["HumanEval"] = humaneval_prompts(args.humaneval, tokenizer, args.num_prompts)
    specs = [("linear", SpecParams("linear"))] + [
        (f"tree {b}", SpecParams("tree", b)) for b in (8, 16, 32, 64, 128)]
    lines = ["| set | T | " + " | ".join(label for label, _ in specs) + " |",
             "|---|---|" + "---|" * len(specs)]
    rows: dict[str, Any] = {}
    for temperature in (float(t) for t in args.temperatures.split(",")):
        sampling = SamplingParams(temperature=temperature, seed=1234) if temperature else None
        for name, prompts in sets.items():
            cells = []
            for label, spec in specs:
                run = run_batch(engine, prompts, spec, args.max_tokens, sampling)
                rows[f"{name}/T{temperature:g}/{label}"] = round(run["tau"], 3)
                cells.append(f"{run['tau']:.2f}")
            lines.append(f"| {name} | {temperature:g} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    (OUT / "acceptance.md").write_text("\n".join(lines) + "\n")
    return rows


def first_diff(got: list[list[int]], reference: list[list[int]]) -> list[int]:
    out = []
    for a, b in zip(got, reference, strict=True):
        out.append(next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), -1))
    return out


def stage_speed(args: argparse.Namespace) -> dict[str, Any]:
    target, drafter, tokenizer = load(args, torch.bfloat16)
    prompts = humaneval_prompts(args.humaneval, tokenizer, args.num_prompts)
    rows: dict[str, Any] = {}
    # (row suffix, invariant GEMMs, fused norm/SwiGLU prologues, the short greedy ar round,
    # the SwiGLU epilogue, dependent launches, their L2 prefetches, modes; "no reduce
    # norms" runs the norms after o_proj / down on their own (EngineConfig.reduce_fusions
    # off); "no rope epilogue" runs RoPE and the KV store after the QKV GEMM
    # (EngineConfig.rope_epilogue off); "no round commit" the verify half's bookkeeping
    # in PyTorch (EngineConfig.round_commit off); "no query groups" tree attention one
    # query a program (tree_attention.set_query_groups); "separate context" the
    # drafter's new context rows appended before the block, not in its QKV GEMMs
    # (Backend.context_in_block off); "plain top-K shapes" the vocabulary top-K's
    # tournament in one-warp 512-token programs everywhere (vocab_topk.set_shapes);
    # "torch logsumexp" the drafter's log-sum-exp in torch.logsumexp (one block a row:
    # a pass over the logits, as the log-softmax before it) instead of from the
    # vocabulary top-K's own passes (ddtree.tree.set_fused_lse);
    # "torch prologue" the draft half's inputs from PyTorch's builders (~30 small
    # launches) instead of ddtree/kernels/draft_prologue.py's two kernels
    # (Backend.draft_prologue off);
    # "drafter cuBLAS" the drafter's GEMMs in cuBLAS (not batch invariant: the drafts
    # may change with the batch, the target's tokens may not);
    # "PyTorch tree"
    # builds the drafter's trees in PyTorch instead of one kernel). The other
    # invariant rows are compared with the plain ar tokens (none may change a bit); cuBLAS
    # rows with cuBLAS ar (not batch invariant).
    variants = (("", True, False, True, True, True, True,
                 ("ar", "linear", "tree@15", "tree@15k8", "tree@16", "tree@32", "tree@64",
                  "tree@128", "shadow@16", "shadow@64")),
                (" (generic ar)", True, False, False, True, True, True, ("ar",)),
                (" (no epilogue)", True, False, True, False, True, True, ("ar", "tree@32")),
                (" (no reduce fusions)", True, False, True, True, True, True,
                 ("ar", "linear", "tree@16", "tree@32", "shadow@16")),
                (" (no rope epilogue)", True, False, True, True, True, True,
                 ("ar", "linear", "tree@16", "tree@32", "shadow@16")),
                (" (no round commit)", True, False, True, True, True, True,
                 ("ar", "linear", "tree@16", "tree@32", "shadow@16")),
                (" (no query groups)", True, False, True, True, True, True,
                 ("ar", "linear", "tree@16", "tree@32", "shadow@16")),
                (" (separate context)", True, False, True, True, True, True,
                 ("ar", "linear", "tree@16", "tree@32", "shadow@16")),
                (" (plain top-K shapes)", True, False, True, True, True, True,
                 ("ar", "tree@16", "tree@32")),
                (" (torch logsumexp)", True, False, True, True, True, True,
                 ("ar", "tree@16", "tree@32")),
                (" (torch prologue)", True, False, True, True, True, True,
                 ("ar", "linear", "tree@16", "tree@32")),
                (" (drafter cuBLAS)", True, False, True, True, True, True,
                 ("ar", "linear", "tree@16", "tree@32")),
                (" (no PDL)", True, False, True, True, False, False, ("ar", "tree@32")),
                (" (no prefetch)", True, False, True, True, True, False, ("ar", "tree@32")),
                (" (PyTorch tree)", True, False, True, True, True, True,
                 ("linear", "tree@32", "tree@64")),
                (" (torch top-K)", True, False, True, True, True, True,
                 ("tree@16", "tree@32")),
                (" (fused)", True, True, True, False, True, True, ("ar", "tree@32")),
                (" (cuBLAS)", False, False, True, True, True, True, ("ar", "tree@64")))
    wanted = set(args.speed_modes.split(",")) if args.speed_modes else None
    kinds = set(args.speed_variants.split(","))
    ar_tokens = None
    for suffix, invariant, fused, fast_ar, epilogue, pdl, prefetch, names in variants:
        kind = suffix.strip(" ()") or "plain"
        names = tuple(n for n in names if wanted is None or n in wanted or n == "ar")
        if kind not in kinds or not names:
            continue
        # graphs keep the launches they were captured with
        launches_before = set_pdl(pdl), set_prefetch(prefetch)
        groups_before = set_query_groups(kind != "no query groups")
        shapes_before = set_topk_shapes(kind != "plain top-K shapes")
        lse_before = set_fused_lse(kind != "torch logsumexp")
        engine = build_engine(target, drafter, EngineConfig(
            max_num_seqs=4, max_model_len=2048, invariant=invariant, fused_prologues=fused,
            fast_ar=fast_ar, swiglu_epilogue=epilogue,
            reduce_fusions=kind != "no reduce fusions",
            rope_epilogue=kind != "no rope epilogue",
            round_commit=kind != "no round commit"))
        if isinstance(engine.drafting, LocalDrafter):  # the drafter's layers as the target's
            engine.drafting.backend = dataclasses.replace(
                engine.drafting.backend, fused=fused, tree_build=kind != "PyTorch tree",
                vocab_topk=kind not in ("PyTorch tree", "torch top-K"),
                context_in_block=kind != "separate context",
                draft_prologue=kind != "torch prologue",
                invariant=invariant and kind != "drafter cuBLAS")
        # Every prefill bucket (with and without the drafter's features) and the policy's
        # round shapes captured first, as a server does at start: without it a variant's
        # first drafting row likely timed the captures of the prompts' feature prefills
        # (lease 39: "torch logsumexp" tree@16 -22%, lease 38: "plain top-K shapes" -17%)
        warmed_up(engine)
        reference = ar_tokens if invariant else None
        for name in names:
            sequential(engine, prompts[:1], SPECS[name], 32)  # warm this shape up
            run = sequential(engine, prompts, SPECS[name], args.max_tokens)
            reference = reference or run["tokens"]
            ar_tokens = ar_tokens or run["tokens"]
            key = f"{name}{suffix}"
            rows[key] = {"tok_s": round(run["tok_s"], 1), "tau": round(run["tau"], 3),
                         "same_as_ar": run["tokens"] == reference}
            print(f"{key:>18}: {run['tok_s']:8.1f} tok/s  tau {run['tau']:.2f}  "
                  f"=ar {rows[key]['same_as_ar']}", flush=True)
        del engine
        set_pdl(launches_before[0])
        set_prefetch(launches_before[1])
        set_query_groups(groups_before)
        set_topk_shapes(shapes_before)
        set_fused_lse(lse_before)
    if args.hf:
        rows["hf static cache"] = {"tok_s": round(hf_static(args, prompts), 1)}
        print(f"{'hf static cache':>18}: {rows['hf static cache']['tok_s']:8.1f} tok/s",
              flush=True)
    return rows


def hf_static(args: argparse.Namespace, prompts: list[list[int]]) -> float:
    """transformers' own generate with a static cache (what a user would pick instead),
    timed on a second pass over the prompts: the first compiles its graphs (a static cache
    is sized per prompt + max tokens, so each prompt length compiles once)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.bfloat16).cuda().eval()
    kwargs = dict(do_sample=False, cache_implementation="static", pad_token_id=2,
                  eos_token_id=None, max_new_tokens=args.max_tokens,
                  min_new_tokens=args.max_tokens)
    tokens, seconds = 0, 0.0
    for timed in (False, True):
        for prompt in prompts:
            ids = torch.tensor([prompt], device="cuda")
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = model.generate(ids, **kwargs)
            torch.cuda.synchronize()
            if timed:
                seconds += time.perf_counter() - start
                tokens += out.shape[1] - ids.shape[1]
    del model
    return tokens / seconds


def stage_load(args: argparse.Namespace) -> dict[str, Any]:
    """All requests at once (a fixed-length batch, `args.load_tokens` each), per
    concurrency: ar, tree@16, tree@64, auto, each twice (cold: captures the shapes the
    batch drains through and `auto` measures them; warm: a server's steady state), then
    ar and auto once more each, alternated; `ar/c*` and `auto/c*` are the means of their
    two warm runs (the two modes measured minutes apart on a shared host differed by
    5-8% where both ran the same ar rounds: lease 38, c32 / c64)."""
    target, drafter, tokenizer = load(args, torch.bfloat16)
    prompts = humaneval_prompts(args.humaneval, tokenizer, 64)
    engine = build_engine(target, drafter, EngineConfig(max_num_seqs=64, max_model_len=1024))
    if args.warm_up and engine.graphs.enabled:  # what a server does before serving
        started = time.perf_counter()
        print(f"warm-up: {engine.warm_up()} shapes, {engine.graphs.num_graphs} graphs, "
              f"{time.perf_counter() - started:.1f} s", flush=True)
    rows: dict[str, Any] = {}

    def measure(name: str, concurrency: int, phase: str) -> dict[str, Any]:
        graphs, measured = engine.graphs.num_graphs, engine.policy_measurements
        policy = engine.policy if name == "auto" else None
        before = policy.snapshot() if policy is not None else None
        run = run_batch(engine, prompts[:concurrency], SPECS[name], args.load_tokens)
        rate = run["num_tokens"] / run["wall_s"]
        row = {"tok_s": round(rate, 1), "tau": round(run["tau"], 3),
               "graphs_captured": engine.graphs.num_graphs - graphs,
               "policy_measurements": engine.policy_measurements - measured}
        if policy is not None:  # what its rows were admitted on, and what it ended with
            row["policy_before"], row["policy_after"] = before, policy.snapshot()
        print(f"{name:>8} c{concurrency:<3} {phase}: {rate:9.1f} tok/s total  "
              f"tau {run['tau']:.2f}  graphs +{row['graphs_captured']}  "
              f"measured +{row['policy_measurements']}", flush=True)
        return row

    for concurrency in (1, 8, 32, 64):
        for name in ("ar", "tree@16", "tree@64", "auto"):
            for phase in ("cold", "warm"):
                row = measure(name, concurrency, phase)
                rows[f"{name}/c{concurrency}" + ("" if phase == "warm" else "/cold")] = row
        for name in ("ar", "auto"):  # a second warm run of each, alternated
            again = measure(name, concurrency, "warm 2")
            first = rows[f"{name}/c{concurrency}"]
            rows[f"{name}/c{concurrency}/warm2"] = again
            first["tok_s_runs"] = [first["tok_s"], again["tok_s"]]
            first["tok_s"] = round((first["tok_s"] + again["tok_s"]) / 2, 1)
        ratio = rows[f"auto/c{concurrency}"]["tok_s"] / rows[f"ar/c{concurrency}"]["tok_s"]
        print(f"    auto / ar at c{concurrency}: {ratio:.3f} (means of two warm runs)",
              flush=True)
    if engine.policy is not None:  # what `auto` believed: measured and traffic costs, tau
        rows["auto/policy"] = engine.policy.snapshot()
    return rows


def stage_autoseq(args: argparse.Namespace) -> dict[str, Any]:
    """`auto` one request after another (concurrency 1, as `ddtree bench` runs c1): each
    request's tokens per round and final mode, and what the policy believes after it."""
    target, drafter, tokenizer = load(args, torch.bfloat16)
    prompts = humaneval_prompts(args.humaneval, tokenizer, 24)
    engine = build_engine(target, drafter, EngineConfig(max_num_seqs=8, max_model_len=1024))
    rows: dict[str, Any] = {}
    for i, prompt in enumerate(prompts):
        run = run_batch(engine, [prompt], SPECS["auto"], args.max_tokens)
        assert engine.policy is not None
        snapshot = engine.policy.snapshot()
        rows[f"request{i}"] = {"tau": round(run["tau"], 3), "tok_s": round(
            run["num_tokens"] / run["wall_s"], 1), "policy": snapshot}
        print(f"autoseq {i:>2}: tau {run['tau']:.2f}  "
              f"{run['num_tokens'] / run['wall_s']:8.1f} tok/s  "
              f"tau per size {json.dumps(snapshot['tau'])}  prefers_ar "
              f"{ {b: v['prefers_ar'] for b, v in snapshot['batches'].items()} }", flush=True)
    return rows


def stage_profile(args: argparse.Namespace) -> dict[str, Any]:
    """Per-round wall time vs the GPU time of the draft and verify halves, then the top
    kernels (CUDA time) of a few profiled rounds, per (mode, batch)."""
    from torch.profiler import ProfilerActivity, profile

    target, drafter, tokenizer = load(args, torch.bfloat16)
    prompts = humaneval_prompts(args.humaneval, tokenizer, 8)
    engine = build_engine(target, drafter, EngineConfig(max_num_seqs=8, max_model_len=2048))
    rows: dict[str, Any] = {}
    tables = []
    for name in args.profile_modes.split(","):
        for batch in (1, 8):
            run_batch(engine, prompts[:batch], SPECS[name], 32)  # warm-up + capture
            run = run_batch(engine, prompts[:batch], SPECS[name], 128)
            rounds = max(run["rounds"], 1)  # summed over rows: per row-round
            row = {"round_ms": round(run["decode_s"] / max(rounds / batch - 1, 1) * 1e3, 3),
                   **{f"{k}_gpu_ms": round(v / rounds * 1e3, 3)
                      for k, v in run["stages"].items()},
                   "tau": round(run["tau"], 3)}
            rows[f"{name}/b{batch}"] = row
            print(f"profile {name:>8} b{batch}: {row}", flush=True)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                run_batch(engine, prompts[:batch], SPECS[name], 32)
            table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25)
            tables.append(f"== {name} batch {batch} (32 tokens per row)\n{table}")
            (OUT / "profile_kernels.txt").write_text("\n".join(tables))  # as it goes
    if args.prefill_profile:
        rows.update(prefill_times(target, drafter, prompts))
    return rows


def prefill_times(target: Any, drafter: Any, prompts: list[list[int]]) -> dict[str, Any]:
    """Time to the first token of one request alone (its prefill, plus the drafter's
    context for a drafting mode), static shapes replayed as graphs vs eager, in ms."""
    rows: dict[str, Any] = {}
    for static in (True, False):
        engine = build_engine(target, drafter, EngineConfig(
            max_num_seqs=8, max_model_len=2048, static_prefill=static))
        for name in ("ar", "tree@32"):
            sequential(engine, prompts, SPECS[name], 1)  # capture each bucket first
            times = [run_batch(engine, [p], SPECS[name], 1)["wall_s"] for p in prompts]
            key = f"prefill {name} {'static' if static else 'eager'}"
            rows[key] = {"ttft_ms": round(sum(times) / len(times) * 1e3, 2),
                         "prompt_tokens": round(sum(map(len, prompts)) / len(prompts), 1)}
            print(f"profile {key}: {rows[key]}", flush=True)
    return rows


def build_8b(epilogue: bool = True) -> tuple[Any, Any]:
    """A Qwen3-8B-shaped target and a z-lab-8B-shaped drafter, random bf16 weights built
    on the GPU (nothing to carry)."""
    config = TargetConfig.from_hf({
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936,
        "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 40960,
        "eos_token_id": 151645, "tie_word_embeddings": False})
    draft_config = DrafterConfig(
        hidden_size=4096, num_hidden_layers=5, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, intermediate_size=12288, vocab_size=151936, block_size=16,
        num_target_layers=36, target_layer_ids=(1, 9, 17, 25, 33), mask_token_id=151669)
    torch.manual_seed(0)
    with torch.device("cuda"):
        torch.set_default_dtype(torch.bfloat16)
        target = TargetModel(config)
        drafter = DFlashDrafter(draft_config)
        torch.set_default_dtype(torch.float32)
    for module in (target, drafter):
        for p in module.parameters():
            torch.nn.init.normal_(p, std=0.02)
    from ddtree.models.ops import Backend
    target.backend = Backend.for_device(torch.device("cuda"))
    target = target.eval().requires_grad_(False).fuse_weights()
    drafter = drafter.eval().requires_grad_(False)
    return target, drafter


PROMPT_8B = torch.randint(0, 151000, (512,), generator=torch.Generator().manual_seed(1)).tolist()


def stage_shapes8b(args: argparse.Namespace) -> dict[str, Any]:
    """Random Qwen3-8B-shaped pair: step times against the weight-read floor."""
    set_wide_stages(args.wide_stages)
    set_query_groups(args.query_groups)
    set_topk_shapes(args.topk_shapes)
    set_fused_lse(args.fused_lse)
    target, drafter = build_8b()
    weight_bytes = sum(p.numel() * p.element_size() for p in target.parameters())
    # a step reads one row of the embedding table, not all of it
    step_bytes = weight_bytes - target.embeddings.embed_tokens.weight.numel() * 2
    bandwidth = copy_bandwidth()
    rows: dict[str, Any] = {"weight_gb": round(weight_bytes / 1e9, 2),
                            "copy_tb_s": round(bandwidth / 1e12, 2),
                            "floor_ms": round(weight_bytes / bandwidth * 1e3, 3),
                            "floor_without_embedding_ms": round(step_bytes / bandwidth * 1e3, 3),
                            "wide_stages": args.wide_stages, "query_groups": args.query_groups,
                            "topk_shapes": args.topk_shapes,
                            "fused_lse": args.fused_lse}
    engine = build_engine(target, drafter, EngineConfig(max_num_seqs=8, max_model_len=1024,
                                                        max_budget=64,
                                                        swiglu_epilogue=args.epilogue,
                                                        fused_prologues=args.fused,
                                                        reduce_fusions=args.reduce_fusions))
    if isinstance(engine.drafting, LocalDrafter):  # the drafter's layers as the target's
        engine.drafting.backend = dataclasses.replace(
            engine.drafting.backend, fused=args.fused, context_in_block=args.context_in_block,
            invariant=not args.drafter_cublas, draft_prologue=args.draft_prologue)
    rows["context_in_block"] = args.context_in_block
    rows["drafter_cublas"] = args.drafter_cublas
    rows["draft_prologue"] = args.draft_prologue
    prompt = PROMPT_8B
    ar_tokens = None
    for name, spec in (("ar", SpecParams("ar")), ("tree@63", SpecParams("tree", 63)),
                       ("linear", SpecParams("linear"))):
        run_batch(engine, [prompt], spec, 8)  # warm-up + capture
        with RoundEnds(engine) as ends:
            run = run_batch(engine, [prompt], spec, 64)
        rounds = max(run["rounds"], 1)
        ar_tokens = ar_tokens or run["tokens"]
        steady = ends.steady_ms()
        # random weights: near-tied logits everywhere, so a verify whose bits differ from
        # the ar step's shows up as another token. round_ms: the decode's wall time over
        # rounds - 1 (as every lease before the forty-first reported it); step_ms: a
        # round's device time in steady state (RoundEnds)
        rows[name] = {"round_ms": round(run["decode_s"] / max(rounds - 1, 1) * 1e3, 3),
                      "step_ms": round(steady, 3) if steady is not None else None,
                      **{f"{k}_ms": round(v / rounds * 1e3, 3) for k, v in run["stages"].items()},
                      "same_as_ar": run["tokens"] == ar_tokens}
        print(f"8B {name}: {rows[name]}", flush=True)
    # the ar tokens' digest: runs that must not move a bit (the same tilings on other
    # machines, launch and prefetch changes) compare it across runs
    rows["ar_tokens_sha1"] = hashlib.sha1(repr(ar_tokens).encode()).hexdigest()[:12]
    print(f"8B ar tokens sha1 {rows['ar_tokens_sha1']}", flush=True)
    for key in ("round_ms", "step_ms"):
        if rows["ar"][key]:
            print(f"8B ar {key} / floor {rows['ar'][key] / rows['floor_ms']:.3f}x "
                  f"(floor {rows['floor_ms']} ms at {rows['copy_tb_s']} TB/s)", flush=True)
    print(json.dumps(rows), flush=True)
    return rows


def stage_profile8b(args: argparse.Namespace) -> dict[str, Any]:
    """The 8B shapes' kernels: a torch.profiler trace of a few ar steps and tree@63 rounds
    (Chrome traces and the top-kernel tables under $OUT; each kernel's grid is in the
    trace, which tells the GEMMs apart)."""
    from torch.profiler import ProfilerActivity, profile

    target, drafter = build_8b()
    engine = build_engine(target, drafter, EngineConfig(max_num_seqs=8, max_model_len=1024,
                                                        max_budget=64))
    tables = []
    modes = {"ar": SpecParams("ar"), "tree@63": SpecParams("tree", 63),
             "linear": SpecParams("linear")}
    for name in args.profile8b_modes.split(","):
        spec = modes[name]
        run_batch(engine, [PROMPT_8B], spec, 8)  # warm-up + capture
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run_batch(engine, [PROMPT_8B], spec, 8)
        prof.export_chrome_trace(str(OUT / f"trace8b_{name.replace('@', '')}.json"))
        table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=20)
        tables.append(f"== 8B {name} (8 tokens)\n{table}")
    # The draft half alone (the drafter block): each captured draft graph replayed 20
    # times with nothing between (it is idempotent: the same context, the same trees),
    # its kernels by GPU time a replay
    for key in [key for key in engine.graphs._graphs
                if isinstance(key, tuple) and key[:1] == ("draft",)]:
        graph, _ = engine.graphs._graphs[key]
        for _ in range(3):
            graph.replay()
        sync()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                graph.replay()
            sync()
        table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=30)
        tables.append(f"== 8B draft graph {key} alone (20 replays)\n{table}")
        print(tables[-1][:4000], flush=True)
    (OUT / "profile8b_kernels.txt").write_text("\n".join(tables))
    print(tables[0][:3000], flush=True)
    return {}


def copy_bandwidth() -> float:
    """Bytes read + written per second of a large device-to-device copy."""
    src = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)  # 2 GiB
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize()
    return 2 * src.numel() * 2 * 10 / (time.perf_counter() - start)


def load(args: argparse.Namespace, dtype: torch.dtype) -> tuple[Any, Any, Any]:
    from transformers import AutoTokenizer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: smoke runs
    target, drafter = load_pair(args.target, args.drafter, device,
                                dtype if device.type == "cuda" else torch.float32)
    return target, drafter, AutoTokenizer.from_pretrained(args.target)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stages", default="exact,speed")
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--drafter", type=Path, default=Path("models/smollm2-135m-dflash"))
    parser.add_argument("--humaneval", type=Path, required=True)
    parser.add_argument("--spec-bench", type=Path, default=Path("/tmp/spec_bench"))
    parser.add_argument("--num-prompts", type=int, default=6)
    parser.add_argument("--speed-modes", default="", help="speed stage: these modes only "
                        "(comma-separated, ar always; default all)")
    parser.add_argument("--speed-variants",
                        default="plain,generic ar,no epilogue,no reduce fusions,no PDL,no prefetch,"
                        "PyTorch tree,"
                        "torch top-K,fused,cuBLAS",
                        help="speed stage: which engine variants")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--epilogue", action=argparse.BooleanOptionalAction, default=True,
                        help="shapes8b: the gate_up GEMM's SwiGLU epilogue (A/B)")
    parser.add_argument("--exact-modes", default="",
                        help="exact stage: these modes only (comma-separated, ar first; "
                             "default all)")
    parser.add_argument("--target-attn-tiles", default="",
                        help="exact stage: the target's tree-attention tiling, e.g. 64/2/2")
    parser.add_argument("--drafter-attn-tiles", default="",
                        help="exact stage: the drafter's tree-attention tiling, e.g. 64/2/2")
    parser.add_argument("--hf", action=argparse.BooleanOptionalAction, default=True,
                        help="speed stage: transformers' static-cache generate last")
    parser.add_argument("--fused-lse", action=argparse.BooleanOptionalAction,
                        default=True, help="shapes8b: the drafter's log-sum-exp from the "
                        "vocabulary top-K's passes (else torch.logsumexp; A/B)")
    parser.add_argument("--draft-prologue", action=argparse.BooleanOptionalAction,
                        default=True, help="shapes8b: the draft half's inputs from two "
                        "kernels (Backend.draft_prologue; else PyTorch's builders; A/B)")
    parser.add_argument("--drafter-cublas", action=argparse.BooleanOptionalAction,
                        default=False, help="shapes8b: the drafter's GEMMs in cuBLAS (A/B)")
    parser.add_argument("--topk-shapes", action=argparse.BooleanOptionalAction, default=True,
                        help="shapes8b: the vocabulary top-K's tuned tournament shapes "
                        "(vocab_topk.SHAPES; A/B)")
    parser.add_argument("--reduce-fusions", action=argparse.BooleanOptionalAction, default=True,
                        help="shapes8b: the norms after o_proj / down in their split-K "
                        "reduces (EngineConfig.reduce_fusions; A/B)")
    parser.add_argument("--fused", action=argparse.BooleanOptionalAction, default=False,
                        help="shapes8b: the norms and SwiGLU fused into the GEMMs' prologues "
                        "(EngineConfig.fused_prologues; A/B)")
    parser.add_argument("--wide-stages", action=argparse.BooleanOptionalAction, default=True,
                        help="shapes8b: tree attention's wide launches (more query-KV-head "
                        "pairs than SMs) at the head dim's WIDE_STAGES (A/B; no bit moves)")
    parser.add_argument("--context-in-block", action=argparse.BooleanOptionalAction,
                        default=True, help="shapes8b: the drafter's new context rows in its "
                        "block's QKV GEMMs (Backend.context_in_block; A/B; no bit moves)")
    parser.add_argument("--query-groups", action=argparse.BooleanOptionalAction, default=True,
                        help="shapes8b: tree attention's query groups (a shared prefix split "
                        "once per group of nodes; A/B; no bit moves)")
    parser.add_argument("--linear-table", type=Path, default=None,
                        help="a GEMM tiling table (JSON, as ddtree/kernels/linear_tuned.json) "
                             "to run with instead of the committed one (A/B of tilings)")
    parser.add_argument("--profile-modes", default="ar,tree@16,tree@32",
                        help="profile stage: the modes profiled at batch 1 and 8")
    parser.add_argument("--profile8b-modes", default="ar,tree@63,linear",
                        help="profile8b: the modes traced (the draft graphs are then "
                             "replayed alone if any were captured)")
    parser.add_argument("--prefill-profile", action=argparse.BooleanOptionalAction,
                        default=True, help="profile stage: the first token's time too")
    parser.add_argument("--load-tokens", type=int, default=128)
    parser.add_argument("--warm-up", action=argparse.BooleanOptionalAction, default=False,
                        help="load stage: capture every shape first, as a server does "
                             "(Engine.warm_up), so no run pays a capture")
    parser.add_argument("--temperatures", default="0,1", help="acceptance stage")
    args = parser.parse_args(argv)
    if args.linear_table is not None:  # read by linear_config at every launch
        from ddtree.kernels import matmul

        matmul.TUNED.clear()
        matmul.TUNED.update(json.loads(args.linear_table.read_text()))
    OUT.mkdir(parents=True, exist_ok=True)
    stages = {"exact": stage_exact, "speed": stage_speed, "load": stage_load,
              "exactsets": stage_exact_sets, "profile": stage_profile,
              "autoseq": stage_autoseq,
              "acceptance": stage_acceptance,
              "shapes8b": stage_shapes8b, "profile8b": stage_profile8b,
              "fp32": lambda a: stage_exact(a, torch.float32, ("ar", "linear", "tree@64"))}
    failed = 0
    for name in args.stages.split(","):
        started = time.perf_counter()
        try:
            result = stages[name](args)
        except Exception as exc:  # one stage failing must not lose the others' results
            import traceback

            traceback.print_exc()
            result, failed = {"error": repr(exc)}, failed + 1
        result["seconds"] = round(time.perf_counter() - started, 1)
        (OUT / f"engine_{name}.json").write_text(json.dumps(result, indent=1))
        print(f"== stage {name}: {result['seconds']} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
