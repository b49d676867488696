"""Tunes `invariant_linear`'s tiling per weight shape on the GPU, for the shapes the project
serves, and writes the table `ddtree/kernels/linear_tuned.json` reads (key "NxK:dtype").

Each candidate tiling is timed inside a CUDA graph (what the engine replays) at the row
counts of decoding and verifying (T = 1, 16, 65, 260); the score is their sum. A candidate
is kept only if its rows are bitwise the same at every T (the point of the kernel) and it
is as accurate as the default. The tiling stays a function of the weight alone.
Timed as the engine launches it (dependent launches on sm_90+, ddtree/kernels/launch.py).
Usage: python3 scripts/gpu/tune_linear.py [--out FILE] [--shapes smollm2,drafter]
(prints a table, writes JSON)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from itertools import product
from pathlib import Path

import torch

from ddtree.kernels.matmul import (
    TUNED_PATH,
    LinearConfig,
    linear_config,
    linear_reference,
    linear_with_config,
    tuned_key,
)

# (name, N, K, output dtype): the demo target, its drafter, the 8B target and drafter.
SHAPES = [
    ("smollm2.qkv", 960, 576, None), ("smollm2.o", 576, 576, None),
    ("smollm2.gate_up", 3072, 576, None), ("smollm2.down", 576, 1536, None),
    ("smollm2.lm_head", 49152, 576, torch.float32),
    ("drafter.gate_up", 1280, 576, None), ("drafter.down", 576, 640, None),
    ("drafter.fc", 576, 2880, None),  # five target layers' features -> hidden (fuse_infer)
    ("qwen3.qkv", 6144, 4096, None), ("qwen3.o", 4096, 4096, None),
    ("qwen3.gate_up", 24576, 4096, None), ("qwen3.down", 4096, 12288, None),
    ("qwen3.drafter_fc", 4096, 20480, None),
]
ROWS = (1, 16, 65, 260)
REPLAYS = 20


def candidates(in_features: int) -> list[LinearConfig]:
    out = []
    for block_n, block_k, split_k, stages in product((32, 64, 128), (64, 128), (1, 2, 3, 4),
                                                     (3, 4, 5)):
        if in_features // block_k < 2 * split_k or in_features % block_k:
            continue  # too few K blocks to split, or a masked last one (K = 2,880)
        out.append(LinearConfig(64, block_n, block_k, split_k, 4, stages))
    return out


def graph_us(fn: object, inputs: list[torch.Tensor]) -> float:
    """Microseconds per call of fn(x) inside a CUDA graph, over rotating inputs."""
    for x in inputs:
        fn(x)  # type: ignore[operator]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(REPLAYS):
            fn(inputs[i % len(inputs)])  # type: ignore[operator]
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (5 * REPLAYS)


def check(config: LinearConfig, weight: torch.Tensor, out_dtype: torch.dtype | None) -> bool:
    """Rows bitwise equal at every T, accuracy like the default tiling."""
    x = torch.randn(ROWS[-1], weight.shape[1], device="cuda", dtype=weight.dtype)
    full = linear_with_config(x, weight, None, out_dtype, config)
    for rows in ROWS[:-1]:
        for offset in (0, 3):
            part = linear_with_config(x[offset:offset + rows].contiguous(), weight, None,
                                      out_dtype, config)
            if not torch.equal(part, full[offset:offset + rows]):
                return False
    reference = linear_reference(x, weight, None, torch.float32)
    default = linear_with_config(x, weight, None, out_dtype,
                                 linear_config(*weight.shape, weight.dtype)).float()
    error = (full.float() - reference).norm() / reference.norm()
    return bool(error <= 1.5 * (default - reference).norm() / reference.norm() + 1e-6)


def tune(name: str, out_features: int, in_features: int, out_dtype: torch.dtype | None,
         budget_s: float) -> tuple[LinearConfig, float, float, float]:
    weight = torch.randn(out_features, in_features, device="cuda", dtype=torch.bfloat16) * 0.02
    inputs = {rows: [torch.randn(rows, in_features, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4)] for rows in ROWS}

    def score(config: LinearConfig) -> float:
        return sum(graph_us(lambda x: linear_with_config(x, weight, None, out_dtype, config),
                            inputs[rows]) for rows in ROWS)

    default = linear_config(out_features, in_features, torch.bfloat16)
    best, best_score = default, score(default)
    started = time.perf_counter()
    for config in candidates(in_features):
        if time.perf_counter() - started > budget_s:
            break
        try:
            value = score(config)
        except Exception:  # noqa: BLE001 - a tiling the compiler refuses is skipped
            continue
        if value < best_score and check(config, weight, out_dtype):
            best, best_score = config, value
    # torch's GEMM (cuBLAS: not batch invariant) on the same rows, for scale
    cublas = sum(graph_us(lambda x: torch.nn.functional.linear(x, weight).to(
        out_dtype or x.dtype), inputs[rows]) for rows in ROWS)
    return best, score(default), best_score, cublas


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=TUNED_PATH)
    parser.add_argument("--seconds-per-shape", type=float, default=8.0)
    parser.add_argument("--shapes", default="",
                        help="comma list of name prefixes to tune (default all); the other "
                             "shapes keep the table's entries")
    args = parser.parse_args(argv)
    prefixes = tuple(filter(None, args.shapes.split(",")))
    table: dict[str, dict[str, int]] = (
        json.loads(args.out.read_text()) if prefixes and args.out.exists() else {})
    print(f"{'shape':<18}{'default us':>12}{'tuned us':>10}{'torch us':>10}  tiling "
          f"(sum over T={ROWS})")
    for name, out_features, in_features, out_dtype in SHAPES:
        if prefixes and not name.startswith(prefixes):
            continue
        best, before, after, cublas = tune(name, out_features, in_features, out_dtype,
                                           args.seconds_per_shape)
        table[tuned_key(out_features, in_features, torch.bfloat16)] = best.__dict__
        print(f"{name:<18}{before:>12.1f}{after:>10.1f}{cublas:>10.1f}  {best}", flush=True)
    args.out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
