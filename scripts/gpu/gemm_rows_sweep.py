"""Whether the invariant GEMM may pick its M x N tiles from the number of rows: at the demo
target's shapes, each weight's committed tiling against the same BLOCK_K / split-K / stages
with other BLOCK_M, BLOCK_N and warp counts, at T = 1 (ar), 33 (one tree of 32), 132 and
264 (8 trees of 16 and 32) by default, or `--rows` (e.g. the static prefill's token
buckets, 256,512,1024,2048), timed inside CUDA graphs; every candidate's output compared
bitwise with the committed tiling's on the same rows (K order unchanged: if the MMA's
per-element sums do not depend on the tile's M and N, the rows stay bitwise the same).

    python3 scripts/gpu/gemm_rows_sweep.py [--rows 1,33,132,264] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from ddtree.kernels.matmul import LinearConfig

sys.path.insert(0, str(Path(__file__).parent))  # the sibling scripts
import gemm_sweep  # noqa: E402
from gemm_sweep import committed_config, gemm  # noqa: E402
from tune_linear import graph_us  # noqa: E402

# (name, N, K, output dtype, SwiGLU epilogue): a SmolLM2-135M decoder layer and LM head
SHAPES = [
    ("qkv", 960, 576, None, False),
    ("o", 576, 576, None, False),
    ("gate_up+swiglu", 3072, 576, None, True),
    ("down", 576, 1536, None, False),
    ("lm_head", 49152, 576, torch.float32, False),
]
# the Qwen3-8B target's (gemm_sweep's shapes) and its drafter's fc (five target layers'
# features -> hidden): at T = 16-32 the drafter's block (16 queries, plus the new context
# rows in its QKV GEMM)
SHAPES_8B = [(f"qwen3.{name}", *shape) for name, *shape in gemm_sweep.SHAPES] + [
    ("qwen3.drafter_fc", 4096, 20480, None, False)]
ROWS = (1, 33, 132, 264)  # the default --rows


def candidates(committed: LinearConfig) -> list[LinearConfig]:
    out = [committed]
    for block_m in (64, 128):
        for block_n in (32, 64, 128):
            for warps in (4, 8):
                config = dataclasses.replace(committed, block_m=block_m, block_n=block_n,
                                             num_warps=warps)
                if config not in out:
                    out.append(config)
    return out


def cublas_us(weight: torch.Tensor, out_dtype: torch.dtype | None, epilogue: bool,
              inputs: list[torch.Tensor]) -> float:
    """cuBLAS (F.linear; the SwiGLU after it) on the same rows: what the kernel is against."""
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(x, weight)
        if epilogue:
            gate, up = y.chunk(2, dim=-1)
            y = torch.nn.functional.silu(gate) * up
        return y if out_dtype is None else y.to(out_dtype)
    return graph_us(fn, inputs)


def sweep(name: str, n: int, k: int, out_dtype: torch.dtype | None,
          epilogue: bool, row_counts: tuple[int, ...] = ROWS) -> list[dict]:
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    inputs = {t: [torch.randn(t, k, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
              for t in row_counts}

    def run(config: LinearConfig) -> Callable[[torch.Tensor], torch.Tensor]:
        return gemm(weight, out_dtype, epilogue, config)

    committed = committed_config(weight, epilogue)
    expected = {t: run(committed)(inputs[t][0]) for t in row_counts}
    rows: list[dict] = [{"cublas_us": {t: round(cublas_us(weight, out_dtype, epilogue,
                                                         inputs[t]), 2) for t in row_counts}}]
    print(f"{name:<15} cuBLAS        " + " ".join(f"T{t}:{rows[0]['cublas_us'][t]:7.2f}"
                                                 for t in row_counts), flush=True)
    for config in candidates(committed):
        try:
            fn = run(config)
            times = {t: round(graph_us(fn, inputs[t]), 2) for t in row_counts}
            same = all(torch.equal(fn(inputs[t][0]), expected[t]) for t in row_counts)
        except Exception as exc:  # noqa: BLE001 - a tiling the compiler refuses
            print(f"  {name} {config}: {type(exc).__name__}", flush=True)
            continue
        rows.append({"config": config.__dict__, "committed": config == committed,
                     "us": times, "bitwise_as_committed": same})
        c = config
        print(f"{name:<15} m{c.block_m:<4} n{c.block_n:<4} w{c.num_warps} "
              f"{'*' if config == committed else ' '} "
              + " ".join(f"T{t}:{times[t]:7.2f}" for t in row_counts)
              + f"  bitwise {same}", flush=True)
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", default=",".join(map(str, ROWS)),
                        help="row counts T, comma-separated")
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--model", choices=("smollm2", "qwen3"), default="smollm2",
                        help="the demo target's shapes or the 8B target's and drafter's")
    args = parser.parse_args(argv)
    row_counts = tuple(int(t) for t in args.rows.split(","))
    shapes = SHAPES if args.model == "smollm2" else SHAPES_8B
    results = {name: sweep(name, n, k, out_dtype, epilogue, row_counts)
               for name, n, k, out_dtype, epilogue in shapes}
    for name, all_rows in results.items():  # the summary: committed vs the best bitwise-equal
        reference, rows = all_rows[0], all_rows[1:]
        committed = next(r for r in rows if r["committed"])
        line = f"{name:<15}"
        for t in row_counts:
            best = min((r for r in rows if r["bitwise_as_committed"]), key=lambda r: r["us"][t])
            line += (f" | T{t} {committed['us'][t]:.1f} -> {best['us'][t]:.1f} "
                     f"(m{best['config']['block_m']} n{best['config']['block_n']} "
                     f"w{best['config']['num_warps']}; cuBLAS "
                     f"{reference['cublas_us'][t]:.1f})")
        print(line)
    print("all candidates bitwise equal to the committed tiling:",
          all(r["bitwise_as_committed"] for rows in results.values() for r in rows[1:]))
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
