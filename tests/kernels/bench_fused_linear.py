"""Benchmark: the GEMMs with a fused prologue against their two separate kernels (what
`Backend(fused=False)` runs), at the demo target's shapes (SmolLM2-135M: hidden 576, MLP
1536) and the row counts of an ar step (1), a chain verify (8), a tree verify (64) and a
batch of four trees (264). `ours_*` is the fused launch, `torch_*` the separate pair
(both Triton). Run on a GPU: `python -m tests.kernels.bench_fused_linear`."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from ddtree.kernels.fused_linear import norm_linear, swiglu_down
from ddtree.kernels.matmul import invariant_linear
from ddtree.kernels.rmsnorm import rms_norm
from ddtree.kernels.swiglu import silu_mul
from tests.kernels.timing import compare, floor_us, num_copies, rotating

HIDDEN, INNER = 576, 1536
# name: (N, K) of the projection the prologue feeds
NORM_LINEARS = {"smollm2.qkv": (960, HIDDEN), "smollm2.gate_up": (2 * INNER, HIDDEN)}
DOWN = {"smollm2.down": (HIDDEN, INNER)}
ROW_COUNTS = (1, 8, 64, 264)


def bench_norm_linear(device: torch.device, shapes: dict[str, tuple[int, int]] = NORM_LINEARS,
                      row_counts: tuple[int, ...] = ROW_COUNTS,
                      dtype: torch.dtype = torch.bfloat16) -> list[dict]:
    """norm_linear(x, residual, ...) vs rms_norm then invariant_linear."""
    rows = []
    for name, (out_features, hidden) in shapes.items():
        weights = _weights(out_features, hidden, dtype, device)
        norm_weight = torch.ones(hidden, device=device, dtype=dtype)
        for num_rows in row_counts:
            x, residual = (torch.randn(num_rows, hidden, device=device).to(dtype)
                           for _ in range(2))
            fused = partial(_fused_norm, x, residual, norm_weight)
            separate = partial(_separate_norm, x, residual, norm_weight)
            moved = weights[0].numel() + num_rows * (3 * hidden + out_features)
            rows.append({"kernel": "norm_linear", "case": name, "T": num_rows,
                         **_time(fused, separate, weights, moved * dtype.itemsize, device)})
    return rows


def bench_swiglu_down(device: torch.device, shapes: dict[str, tuple[int, int]] = DOWN,
                      row_counts: tuple[int, ...] = ROW_COUNTS,
                      dtype: torch.dtype = torch.bfloat16) -> list[dict]:
    """swiglu_down(gate_up, w) vs silu_mul then invariant_linear."""
    rows = []
    for name, (out_features, inner) in shapes.items():
        weights = _weights(out_features, inner, dtype, device)
        for num_rows in row_counts:
            gate_up = torch.randn(num_rows, 2 * inner, device=device).to(dtype)
            fused = partial(swiglu_down, gate_up)
            separate = partial(_separate_swiglu, gate_up)
            moved = weights[0].numel() + num_rows * (2 * inner + out_features)
            rows.append({"kernel": "swiglu_down", "case": name, "T": num_rows,
                         **_time(fused, separate, weights, moved * dtype.itemsize, device)})
    return rows


def _fused_norm(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                weight: torch.Tensor) -> object:
    return norm_linear(x, residual, norm_weight, 1e-6, weight)


def _separate_norm(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                   weight: torch.Tensor) -> object:
    return invariant_linear(rms_norm(x, norm_weight, 1e-6, residual)[0], weight)


def _separate_swiglu(gate_up: torch.Tensor, weight: torch.Tensor) -> object:
    return invariant_linear(silu_mul(gate_up), weight)


def _weights(out_features: int, in_features: int, dtype: torch.dtype,
             device: torch.device) -> list[torch.Tensor]:
    """Enough copies of a random (N, K) weight to overflow the L2 (read from HBM)."""
    weight_bytes = out_features * in_features * dtype.itemsize
    return [(torch.randn(out_features, in_features, device=device) / 32).to(dtype)
            for _ in range(num_copies(weight_bytes, device))]


def _time(fused: Callable[[torch.Tensor], object], separate: Callable[[torch.Tensor], object],
          weights: list[torch.Tensor], moved_bytes: int,
          device: torch.device) -> dict[str, float]:
    """Both as rotations over the weight copies, beside the bytes-moved floor."""
    ours = rotating([lambda w=w: fused(w) for w in weights])
    theirs = rotating([lambda w=w: separate(w) for w in weights])
    return {"floor_us": floor_us(moved_bytes), **compare(ours, theirs, device)}


if __name__ == "__main__":
    cuda = torch.device("cuda")
    for row in bench_norm_linear(cuda) + bench_swiglu_down(cuda):
        print(row)
