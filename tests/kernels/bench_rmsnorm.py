"""Benchmark: the fused residual-add RMSNorm kernel against its eager reference, at the
hidden sizes of the demo target and of Qwen3-8B."""

from __future__ import annotations

import torch

from ddtree.kernels.rmsnorm import rms_norm, rms_norm_reference
from tests.kernels.timing import compare, floor_us

HIDDEN = {"smollm2": 576, "qwen3": 4096}
ROW_COUNTS = (1, 65, 2048)


def bench_rms_norm(device: torch.device, hidden_sizes: dict[str, int] = HIDDEN,
                   row_counts: tuple[int, ...] = ROW_COUNTS,
                   dtype: torch.dtype = torch.bfloat16) -> list[dict]:
    rows = []
    for name, hidden in hidden_sizes.items():
        weight = torch.randn(hidden, device=device).to(dtype)
        for num_rows in row_counts:
            x = torch.randn(num_rows, hidden, device=device).to(dtype)
            residual = torch.randn_like(x)
            times = compare(lambda x=x, r=residual, w=weight: rms_norm(x, w, 1e-6, r),
                            lambda x=x, r=residual, w=weight: rms_norm_reference(x, w, 1e-6, r),
                            device)
            moved = 4 * x.numel() * dtype.itemsize  # x, residual in; normed, h out
            rows.append({"kernel": "rms_norm", "case": f"{name} H={hidden}", "T": num_rows,
                         "floor_us": floor_us(moved), **times})
    return rows


if __name__ == "__main__":
    for row in bench_rms_norm(torch.device("cuda")):
        print(row)
