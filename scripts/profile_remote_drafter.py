"""Host overhead of the remote drafter, on the CPU: the real drafter service (in-process
gRPC server on loopback, the tiny pair's real drafter) and the verifier's Engine with
RemoteDrafter, N rows in one mode for some rounds; per round, the time split into

  verifier pack      RemoteDrafter builds the round's request (features gathered, encoded)
  rpc wait           the exchange minus the drafter's handling: transport, (de)serialising,
                     the stream's queues and threads (the drafter's Unix socket by
                     default; `--grpc`: the gRPC stream)
  drafter unpack     the servicer decodes and checks the request, session bookkeeping
  drafter copies     GraphDrafter's staging around the model (host <-> device on a GPU)
  drafter forward    the drafter model and the tree build (one batched call)
  drafter pack       the servicer encodes the trees
  verifier unpack    the trees checked, placed into the round's buffers

plus the verify forward and the whole step. `overhead` = the remote drafting step minus
the drafter forward: what the hop costs besides the model. The models are tiny, so host
work dominates; the split is measured by wrapping the methods named in STAGES with
time.perf_counter (and, with --cprofile, cProfile on both sides).

    OMP_NUM_THREADS=1 PYTHONPATH=. python scripts/profile_remote_drafter.py --rows 1,8,32

(PYTHONPATH=. so the checkout's packages are profiled, not an installed copy: the header
names the ddtree that was imported.)
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

import ddtree
from ddtree.engine import Engine, EngineConfig, GenerationRequest, SpecParams
from ddtree.engine import core as engine_core
from ddtree.engine.draft_graphs import GraphDrafter
from ddtree.models.target import load_target
from ddtree.models.tiny import make_tiny_pair
from ddtree.service import configure_threads
from drafter_svc.config import DrafterServiceConfig
from drafter_svc.server import build_server
from drafter_svc.servicer import DrafterServicer
from verifier_svc.drafter_client import DrafterClient
from verifier_svc.remote_drafter import RemoteDrafter

# (owner, method, label): the methods timed. Labels are summed per round.
STAGES: tuple[tuple[Any, str, str], ...] = (
    (RemoteDrafter, "propose", "v.propose"),
    (RemoteDrafter, "_request", "v.pack"),
    (DrafterClient, "receive", "v.exchange"),  # the sync exchange and a turn's receive
    (DrafterServicer, "_draft_round", "d.round"),
    (DrafterServicer, "_pack", "d.pack"),
    (GraphDrafter, "propose", "d.graph"),
    (GraphDrafter, "_run", "d.forward"),
)
REPORTED = ("verifier pack", "rpc wait", "drafter unpack", "drafter copies", "drafter forward",
            "drafter pack", "verifier unpack", "overhead", "verify forward", "step", "tok/s")


class Timers:
    """Seconds per label, summed since the last `reset`; thread-safe enough for one
    verifier thread and one drafter thread that never time the same label."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.drafter_profile: cProfile.Profile | None = None
        self.labelled = False  # label each timed call in torch.profiler's trace

    def wrap(self, owner: Any, name: str, label: str) -> None:
        if not hasattr(owner, name):
            return
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            profile = self.drafter_profile if label == "d.round" else None
            if profile is not None:
                profile.enable()
            started = time.perf_counter()
            label_range = (torch.profiler.record_function(label) if self.labelled
                           else contextlib.nullcontext())
            try:
                with label_range:
                    return original(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - started
                if profile is not None:
                    profile.disable()

        setattr(owner, name, timed)

    def reset(self) -> None:
        self.seconds.clear()


def split(s: dict[str, float]) -> dict[str, float]:
    """The reported stages from one round's summed labels (seconds)."""
    return {
        "verifier pack": s["v.pack"],
        "rpc wait": s["v.exchange"] - s["d.round"],
        "drafter unpack": s["d.round"] - s["d.graph"] - s["d.pack"],
        "drafter copies": s["d.graph"] - s["d.forward"],
        "drafter forward": s["d.forward"],
        "drafter pack": s["d.pack"],
        "verifier unpack": s["v.propose"] - s["v.pack"] - s["v.exchange"],
        "overhead": s["v.propose"] - s["d.forward"],
        "verify forward": s["e.verify"],
        "step": s["e.step"],
        "tok/s": s["tokens"] / s["e.step"] if s["e.step"] else 0.0,
    }


@contextmanager
def drafter_service(target: Path, drafter: Path, max_sessions: int,
                    args: argparse.Namespace) -> Iterator[int]:
    config = DrafterServiceConfig(
        drafter=str(drafter), target=str(target), host="127.0.0.1", port=0,
        device=args.device, dtype=args.dtype, max_sessions=max_sessions, log_level="warning")
    server, port = build_server(config)
    try:
        yield port
    finally:
        server.stop(None)


def run_rows(target_dir: Path, port: int, num_rows: int, args: argparse.Namespace,
             timers: Timers, alternate: bool) -> dict[str, Any]:
    """One engine with `num_rows` generations; -> per-round medians (ms) and counts."""
    target = load_target(target_dir, torch.device(args.device),
                         getattr(torch, args.dtype)).eval()
    client = DrafterClient(f"127.0.0.1:{port}", 20.0, 20.0, target.config,
                           use_socket=not args.grpc)
    client.connect(wait=True)
    assert client.info is not None, "the drafter service did not answer"
    print(f"the Draft stream over {client.transport}", file=sys.stderr)
    drafting = RemoteDrafter(client, client.info, 20.0)
    engine = Engine(target, drafting, EngineConfig(max_num_seqs=num_rows, max_queue=0,
                                                   max_budget=args.budget,
                                                   alternate=alternate))
    gen = torch.Generator().manual_seed(0)
    max_tokens = (args.warmup + args.rounds + 14) * drafting.block_size  # + the traced rounds
    for i in range(num_rows):
        prompt = torch.randint(3, target.config.vocab_size, (args.prompt_len,), generator=gen)
        engine.add_request(f"row{i}", GenerationRequest(
            prompt.tolist(), max_tokens, spec=SpecParams(args.mode, args.budget),
            ignore_eos=True))
    # One profiler per thread: cProfile keeps one call stack per profiler object.
    profile = cProfile.Profile() if args.cprofile else None
    # Python 3.12's cProfile is one per process (sys.monitoring): a second profiler enabled
    # in the drafter's thread raises there and fails the Draft stream (lease 10, call 28).
    drafter_profile = (cProfile.Profile() if args.cprofile and sys.version_info < (3, 12)
                       else None)
    rounds: list[dict[str, float]] = []
    raw: list[dict[str, float]] = []
    try:
        for index in range(args.warmup + args.rounds):
            timers.reset()
            timers.drafter_profile = drafter_profile if index >= args.warmup else None
            if profile is not None and index >= args.warmup:
                profile.enable()
            started = time.perf_counter()
            outputs = engine.step()
            timers.seconds["e.step"] += time.perf_counter() - started
            timers.seconds["tokens"] += sum(len(result.new_tokens) for _, result in outputs)
            if profile is not None:
                profile.disable()
            if index >= args.warmup:
                rounds.append(split(timers.seconds))
                raw.append(dict(timers.seconds))
        if args.trace_dir is not None:
            trace_rounds(engine, timers, args.trace_dir / f"trace_rows{num_rows}.json")
        still_drafting = sum(row.drafting for row in engine.running.values())
    finally:
        client.close()
    result: dict[str, Any] = {
        name: 1e3 * statistics.median(r[name] for r in rounds) for name in REPORTED
        if name != "tok/s"}
    result["rows"], result["rows_still_drafting"] = num_rows, still_drafting
    result["alternate"] = alternate
    # tok/s over all timed steps (not the median step: with alternating halves a step is
    # half a round of the batch)
    result["tok/s"] = sum(r["tokens"] for r in raw) / sum(r["e.step"] for r in raw)
    if profile is not None:
        drafter_side = (top_functions(drafter_profile, args.cprofile_top)
                        if drafter_profile is not None else "(not profiled on Python 3.12+)\n")
        result["cprofile"] = (
            f"--- verifier thread ---\n{top_functions(profile, args.cprofile_top)}"
            f"--- drafter thread ---\n{drafter_side}")
    return result


def trace_rounds(engine: Engine, timers: Timers, path: Path, rounds: int = 12) -> None:
    """A torch.profiler trace (CPU ops of every thread, CUDA kernels and copies) of a few
    more rounds, each timed method a labelled range, written as a Chrome trace: where the
    GPU idles in a round and what the host does meanwhile."""
    from torch.profiler import ProfilerActivity, profile

    timers.labelled = True
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(rounds):
                with torch.profiler.record_function("engine.step"):
                    engine.step()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
    finally:
        timers.labelled = False
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))


def top_functions(profile: cProfile.Profile, count: int) -> str:
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(count)
    return out.getvalue()


def _shown(path: Path) -> str:
    """The imported package's folder, relative to the working directory when inside it
    (the output is committed with the results)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        return "(installed) " + path.name


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8,32", help="comma-separated batch sizes")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--mode", default="tree")
    parser.add_argument("--budget", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (both sides)")
    parser.add_argument("--alternate", default="off", choices=("on", "off", "both"),
                        help="the engine's alternating halves (EngineConfig.alternate; off "
                             "by default, as in the engine)")
    parser.add_argument("--dtype", default="float32", help="float32 or bfloat16")
    parser.add_argument("--target", type=Path, default=None, help="a target folder "
                        "(with --drafter; default: --pair's target/)")
    parser.add_argument("--drafter", type=Path, default=None)
    parser.add_argument("--pair", type=Path, default=None,
                        help="a pair folder (target/, drafter/); default: a fresh tiny pair")
    parser.add_argument("--cprofile", action="store_true", help="print cProfile's top functions")
    parser.add_argument("--cprofile-top", type=int, default=25)
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--grpc", action="store_true",
                        help="the Draft stream over gRPC, not the drafter's Unix socket")
    parser.add_argument("--trace-dir", type=Path, default=None,
                        help="also write a torch.profiler Chrome trace of 12 more rounds "
                             "per row count (trace_rows{N}.json)")
    args = parser.parse_args(argv)
    configure_threads(os.environ)  # DDTREE_GIL_SWITCH_INTERVAL_S, as the services do
    all_rows = [int(r) for r in args.rows.split(",")]
    timers = Timers()
    for owner, name, label in STAGES:
        timers.wrap(owner, name, label)
    timers.wrap(engine_core, "verify_into", "e.verify")
    with tempfile.TemporaryDirectory() as tmp:
        pair = args.pair or Path(tmp)
        if args.pair is None and args.target is None:
            make_tiny_pair(pair)
        target_dir = args.target or pair / "target"
        drafter_dir = args.drafter or pair / "drafter"
        results = []
        with drafter_service(target_dir, drafter_dir, max(all_rows), args) as port:
            modes = {"on": (True,), "off": (False,), "both": (False, True)}[args.alternate]
            for num_rows in all_rows:
                for alternate in modes:
                    results.append(run_rows(target_dir, port, num_rows, args, timers,
                                            alternate))
    print(f"per-round medians in ms over {args.rounds} rounds ({args.mode}@{args.budget}, "
          f"{args.device} {args.dtype}, {torch.get_num_threads()} torch threads, "
          f"GIL switch {sys.getswitchinterval() * 1e3:g} ms, ddtree from "
          f"{_shown(Path(ddtree.__file__).parent)})")
    if args.device != "cpu":
        print("(on a GPU the drafter's forward runs inside its replayed graph: it is counted "
              "in 'drafter copies', 'drafter forward' stays 0)")
    print("rows alt  " + "  ".join(f"{name:>15}" for name in REPORTED))
    for r in results:
        print(f"{r['rows']:>4} {'on ' if r['alternate'] else 'off'}  "
              + "  ".join(f"{r[name]:>15.3f}" for name in REPORTED)
              + ("" if r["rows_still_drafting"] == r["rows"]
                 else f"  ({r['rows_still_drafting']} rows still drafting)"))
    for r in results:
        if "cprofile" in r:
            print(f"\n=== cProfile, {r['rows']} rows (by own time) ===\n{r['cprofile']}")
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(
            [{k: v for k, v in r.items() if k != "cprofile"} for r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
