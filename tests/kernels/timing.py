"""How the kernel benchmarks time one call on the GPU, two ways side by side:
`triton.testing.do_bench` (median; it flushes the L2 between calls, and a small kernel's
time includes the host's launch gap) and CUDA-graph replay (what the engine runs: ~1 us per
launch). Inputs rotate through more memory than the L2 holds, so weights and KV come from
HBM as they do in a forward pass. On the CPU (interpreter) it takes one wall-clock call,
only to exercise the code."""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable

import torch
import triton.testing

HBM_BYTES_PER_S = 4.3e12  # copy bandwidth measured on the H200 (docs/GPU.md)
ROTATION_BYTES = 160 << 20  # several times the L2
MAX_COPIES = 64


def num_copies(bytes_per_set: int, device: torch.device) -> int:
    """How many input sets to rotate through so that they overflow the L2."""
    if device.type != "cuda":
        return 1
    return max(1, min(MAX_COPIES, math.ceil(ROTATION_BYTES / max(bytes_per_set, 1))))


def rotating(calls: list[Callable[[], object]]) -> Callable[[], object]:
    """One callable that runs the next of `calls` each time (captured graphs keep the
    order, so a replay also walks through every input set)."""
    order = itertools.cycle(calls)
    return lambda: next(order)()


def floor_us(num_bytes: float) -> float:
    return num_bytes / HBM_BYTES_PER_S * 1e6


def measure(fn: Callable[[], object], device: torch.device) -> dict[str, float]:
    """{'bench_us': do_bench median, 'graph_us': median per call over graph replays}."""
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        wall = (time.perf_counter() - start) * 1e6
        return {"bench_us": wall, "graph_us": wall}
    bench = triton.testing.do_bench(fn, warmup=2, rep=10, return_mode="median") * 1e3
    try:
        graph = graph_replay_us(fn)
    except RuntimeError as error:  # e.g. a torch op that cannot be captured: keep do_bench's
        print(f"graph replay failed: {error}", flush=True)
        graph = math.nan
    return {"bench_us": bench, "graph_us": graph}


def compare(ours: Callable[[], object], theirs: Callable[[], object],
            device: torch.device) -> dict[str, float]:
    """Both measurements of our kernel and of the torch alternative, as ours_* / torch_*
    columns."""
    return {**{f"ours_{key}": value for key, value in measure(ours, device).items()},
            **{f"torch_{key}": value for key, value in measure(theirs, device).items()}}


def graph_replay_us(fn: Callable[[], object], target_ms: float = 2.0, replays: int = 7) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as graphs require
        start.record()
        for _ in range(3):
            fn()
        end.record()
    torch.cuda.current_stream().wait_stream(side)
    end.synchronize()
    calls = int(min(256, max(4, target_ms / max(start.elapsed_time(end) / 3, 1e-3))))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    samples = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / calls * 1e3)
    del graph
    return statistics.median(samples)
