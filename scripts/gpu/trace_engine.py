"""Where the engine's time goes under continuous load, in process, without the bench's
harness: the engine driven directly by a closed loop that keeps C requests in flight (a
finished request's row is refilled at once, as `ddtree bench` does at concurrency C), so
what it shows is the engine's own.

Per (mode, concurrency): tok/s, tau, rows per round, steps, and the host's seconds per
step in each part of `Engine.step` (admission and prefill launch, the prefill's first
tokens, the round's launch, the previous round's completion). `--sync-prefill` adds each
point again with the prefill's first tokens read right after the prefill (the engine
before the prefill stopped draining the pipeline: an A/B in one run); with
`--drafter-addr`, `--alternate` adds it with the batch's two halves taking
turns (`EngineConfig.alternate`: one half's drafter hop beside the other's verify), and
`--in-step` with each round's trees asked for in its own step (`send_ahead` off).
`--trace M/cC`
records a torch.profiler trace of that point's steps (`--trace-steps` of them, after
`--trace-after`) and prints scripts/trace_summary.py's reading of it: each step's wall time
against the GPU's busy time, and the GPU's idle gaps with the host ops beside them.

    python3 scripts/gpu/trace_engine.py --target T --humaneval H.jsonl.gz \\
        --modes ar,tree@16 --concurrency 1,8 --trace tree@16/c8

With `--drafter-addr HOST:PORT` the engine drafts through a running drafter service
(verifier_svc's RemoteDrafter over the gRPC Draft stream), as the verifier of the three
processes does, without the gateway and the verifier's own gRPC.
Writes $OUT/trace_engine.json (and $OUT/trace_*.json.gz).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gzip
import json
import shutil
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from engine_bench import OUT, SPECS, humaneval_prompts, load, sync  # noqa: E402
from trace_summary import main as summarise  # noqa: E402

from ddtree.engine import Engine, EngineConfig, GenerationRequest  # noqa: E402
from ddtree.engine.generate import build_engine  # noqa: E402
from ddtree.sampling import SamplingParams  # noqa: E402
from verifier_svc.drafter_client import DrafterClient  # noqa: E402
from verifier_svc.remote_drafter import RemoteDrafter  # noqa: E402

PARTS = ("_admit", "_read_prefill", "_launch", "_complete")


class Timed:
    """Wraps an engine's step parts once (instance attributes over its methods): host
    seconds per part since `reset`, and a labelled range per call in a profiler trace."""

    def __init__(self, engine: Engine) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        for name in PARTS:
            setattr(engine, name, self._wrap(name, getattr(engine, name)))

    def reset(self) -> None:
        self.seconds.clear()

    def _wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            with torch.profiler.record_function(name.strip("_")):
                try:
                    return method(*args, **kwargs)
                finally:
                    self.seconds[name] += time.perf_counter() - started
        return timed


def sync_prefill(engine: Engine) -> None:
    """The prefill's first tokens read at once (as before 2026-12-03): every admission
    drains the pipeline before the step's round is launched."""
    admit, read = engine._admit, engine._read_prefill
    early: list[Any] = []

    def admit_and_read() -> None:
        admission = admit()
        if admission is not None:
            early.extend(read(admission))

    step = engine.step

    def stepped() -> list[Any]:
        outputs = step()
        outputs[:0], early[:] = early, []
        return outputs

    engine._admit = admit_and_read  # type: ignore[method-assign,assignment]
    engine.step = stepped  # type: ignore[method-assign]


def closed_loop(engine: Engine, timed: Timed, prompts: list[list[int]], spec: Any,
                concurrency: int, max_tokens: int, trace: Path | None,
                trace_steps: int, trace_after: int = 40) -> dict[str, Any]:
    timed.reset()
    queue = list(enumerate(prompts))
    queue.reverse()
    live, tokens, taus, steps = 0, 0, [], 0
    batch_before = list(engine.counters.batch_sizes or [])
    rounds_before = engine.counters.num_rounds

    def submit() -> None:
        nonlocal live
        index, prompt = queue.pop()
        engine.add_request(f"q{index}", GenerationRequest(prompt, max_tokens, SamplingParams(),
                                                          spec))
        live += 1

    profiler: Any = None
    sync()
    started = time.perf_counter()
    while queue and live < concurrency:
        submit()
    while engine.has_work:
        if trace is not None and steps == trace_after:
            profiler = torch.profiler.profile(activities=[
                torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
            profiler.__enter__()
        step_range = (torch.profiler.record_function("engine.step") if profiler is not None
                      else contextlib.nullcontext())
        with step_range:
            outputs = engine.step()
        steps += 1
        if profiler is not None and steps == trace_after + trace_steps:
            profiler.__exit__(None, None, None)
            assert trace is not None
            _export(profiler, trace)
            profiler = None
        for _, result in outputs:
            tokens += len(result.new_tokens)
            if result.finished:
                live -= 1
                if result.stats is not None:
                    taus.append(result.stats.mean_acceptance_length)
                if queue:
                    submit()
    sync()
    wall = time.perf_counter() - started
    if profiler is not None:
        profiler.__exit__(None, None, None)
    batches = [after - before for after, before in
               zip(engine.counters.batch_sizes or [], batch_before, strict=True)]
    rounds = engine.counters.num_rounds - rounds_before
    per_step = {name.strip("_") + "_ms": round(s / max(steps, 1) * 1e3, 4)
                for name, s in timed.seconds.items()}
    return {"tok_s": round(tokens / wall, 1), "tau": round(sum(taus) / max(len(taus), 1), 3),
            "rows_per_round": round(sum(i * c for i, c in enumerate(batches))
                                    / max(rounds, 1), 3),
            "rounds": rounds, "steps": steps, "wall_s": round(wall, 3),
            "round_ms": round(wall / max(rounds, 1) * 1e3, 4), **per_step}


def remote_engine(target: Any, address: str, config: EngineConfig) -> Engine:
    """The engine with verifier_svc's RemoteDrafter on a drafter service at `address`."""
    client = DrafterClient(address, 10.0, 60.0, target.config)
    client.connect(wait=True)
    assert client.info is not None, f"no drafter at {address}"
    return Engine(target, RemoteDrafter(client, client.info, 10.0, 60.0), config)


def _export(profiler: Any, path: Path) -> None:
    raw = path.with_suffix("")  # trace_x.json
    profiler.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--drafter", type=Path, default=Path("models/smollm2-135m-dflash"))
    parser.add_argument("--humaneval", type=Path, required=True)
    parser.add_argument("--modes", default="ar,tree@16")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--sync-prefill", action="store_true",
                        help="each point again with the prefill read at once (A/B)")
    parser.add_argument("--alternate", action="store_true",
                        help="each point again with alternating halves (A/B; remote only)")
    parser.add_argument("--in-step", action="store_true",
                        help="each point again with each round's trees asked for in its own "
                             "step (EngineConfig.send_ahead off: A/B; remote only)")
    parser.add_argument("--trace", default="", help="mode/cC points to trace, comma list")
    parser.add_argument("--trace-steps", type=int, default=120)
    parser.add_argument("--trace-after", type=int, default=40, help="steps before a trace")
    parser.add_argument("--drafter-addr", default="", help="draft through this drafter_svc")
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    target, drafter, tokenizer = load(args, torch.bfloat16)
    prompts = humaneval_prompts(args.humaneval, tokenizer, args.requests)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    config = EngineConfig(max_num_seqs=max(concurrencies),
                          max_model_len=max(map(len, prompts)) + args.max_tokens + 16)
    traced = set(filter(None, args.trace.split(",")))
    rows: dict[str, Any] = {}
    variants = ("deferred", *(("sync",) if args.sync_prefill else ()),
                *(("alternate",) if args.alternate and args.drafter_addr else ()),
                *(("in_step",) if args.in_step and args.drafter_addr else ()))
    for variant in variants:
        run_config = dataclasses.replace(config, alternate=variant == "alternate",
                                         send_ahead=variant != "in_step")
        engine = (remote_engine(target, args.drafter_addr, run_config) if args.drafter_addr
                  else build_engine(target, drafter, run_config))
        if engine.graphs.enabled:
            engine.warm_up()
        timed = Timed(engine)
        if variant == "sync":
            sync_prefill(engine)
        for name in args.modes.split(","):
            for concurrency in concurrencies:
                point = f"{name}/c{concurrency}"
                trace = (OUT / f"trace_{point.replace('/', '_').replace('@', '')}_{variant}"
                         ".json.gz") if point in traced else None
                closed_loop(engine, timed, prompts[:concurrency], SPECS[name], concurrency,
                            32, None, 0)  # this shape's first rounds (the policy, graphs)
                row = closed_loop(engine, timed, prompts, SPECS[name], concurrency,
                                  args.max_tokens, None, 0)
                rows[f"{point}/{variant}"] = row
                print(f"trace_engine {point:<12} {variant:<8} {json.dumps(row)}", flush=True)
                (OUT / "trace_engine.json").write_text(json.dumps(rows, indent=1))
                if trace is not None:  # again, traced (the profiler and export untimed)
                    closed_loop(engine, timed, prompts, SPECS[name], concurrency,
                                args.max_tokens, trace, args.trace_steps, args.trace_after)
                    summary = OUT / trace.name.replace(".json.gz", ".txt")
                    with open(summary, "w") as f, contextlib.redirect_stdout(f):
                        summarise([str(trace), "--steps", "12", "--kernels", "30"])
                    print("".join(_head(summary, 60)), flush=True)
    return 0


def _head(path: Path, lines: int) -> Iterator[str]:
    with open(path) as f:
        for i, line in enumerate(f):
            if i >= lines:
                return
            yield line


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
