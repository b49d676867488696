"""Benchmark: invariant_linear against F.linear (cuBLAS) on the projections of the demo
target (SmolLM2-135M) and of Qwen3-8B, beside the weight-read floor. Run on a GPU through
scripts/gpu/check_kernels.py, or alone: `python -m tests.kernels.bench_matmul`."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from ddtree.kernels.matmul import LinearConfig, linear_config, linear_with_config
from tests.kernels.timing import compare, floor_us, num_copies, rotating

# name: (N, K); the LM heads return float32 logits.
SMOLLM2_LINEARS = {"smollm2.qkv": (960, 576), "smollm2.o": (576, 576),
                   "smollm2.gate_up": (3072, 576), "smollm2.down": (576, 1536),
                   "smollm2.lm_head": (49152, 576)}
QWEN3_LINEARS = {"qwen3.qkv": (6144, 4096), "qwen3.o": (4096, 4096),
                 "qwen3.gate_up": (24576, 4096), "qwen3.down": (4096, 12288),
                 "qwen3.lm_head": (151936, 4096)}
ROW_COUNTS = (1, 16, 65, 256, 520, 2048)


def out_dtype_of(name: str) -> torch.dtype | None:
    return torch.float32 if name.endswith("lm_head") else None


def bench_linear(device: torch.device, shapes: dict[str, tuple[int, int]],
                 row_counts: tuple[int, ...] = ROW_COUNTS,
                 dtype: torch.dtype = torch.bfloat16) -> list[dict]:
    rows = []
    for name, (out_features, in_features) in shapes.items():
        weight_bytes = out_features * in_features * dtype.itemsize
        weights = [torch.randn(out_features, in_features, device=device).to(dtype) / 32
                   for _ in range(num_copies(weight_bytes, device))]
        for num_rows in row_counts:
            rows.append({"kernel": "linear", "case": name, "T": num_rows,
                         **_one(weights, num_rows, out_dtype_of(name))})
    return rows


def tiling_variants(planned: LinearConfig) -> dict[str, LinearConfig]:
    """The planned tiles with every split-K count, and two larger tiles at the planned count."""
    variants = {f"linear S={split}": dataclasses.replace(planned, split_k=split)
                for split in (1, 2, 4, 8)}
    variants["linear 128x128 w8"] = dataclasses.replace(planned, block_m=128, num_warps=8,
                                                        num_stages=3)
    variants["linear 64x256 w8"] = dataclasses.replace(planned, block_n=256, num_warps=8,
                                                       num_stages=3)
    return variants


def bench_linear_tilings(device: torch.device, shapes: dict[str, tuple[int, int]],
                         row_counts: tuple[int, ...] = (1, 64, 2048)) -> list[dict]:
    """Tuning data: other tilings of the same weights (each is its own invariant kernel;
    `torch_*` is cuBLAS again)."""
    rows = []
    for name, (out_features, in_features) in shapes.items():
        weight_bytes = out_features * in_features * 2
        weights = [torch.randn(out_features, in_features, device=device).bfloat16() / 32
                   for _ in range(num_copies(weight_bytes, device))]
        planned = linear_config(out_features, in_features, torch.bfloat16)
        for label, config in tiling_variants(planned).items():
            for num_rows in row_counts:
                rows.append({"kernel": label, "case": name, "T": num_rows,
                             **_one(weights, num_rows, out_dtype_of(name), config)})
    return rows


def _one(weights: list[torch.Tensor], num_rows: int, out_dtype: torch.dtype | None,
         config: LinearConfig | None = None) -> dict[str, float]:
    out_features, in_features = weights[0].shape
    dtype, device = weights[0].dtype, weights[0].device
    x = torch.randn(num_rows, in_features, device=device).to(dtype)
    config = config or linear_config(out_features, in_features, dtype)
    ours = rotating([lambda w=w: linear_with_config(x, w, None, out_dtype, config)
                     for w in weights])
    cublas = rotating([lambda w=w: F.linear(x, w).to(out_dtype or dtype) for w in weights])
    out_bytes = num_rows * out_features * (out_dtype or dtype).itemsize
    moved = weights[0].numel() * dtype.itemsize + x.numel() * dtype.itemsize + out_bytes
    times = compare(ours, cublas, device)
    flops = 2 * num_rows * out_features * in_features
    return {"floor_us": floor_us(moved), "ours_tflops": flops / times["ours_graph_us"] / 1e6,
            **times}


if __name__ == "__main__":
    for row in bench_linear(torch.device("cuda"), {**SMOLLM2_LINEARS, **QWEN3_LINEARS}):
        print(row)
