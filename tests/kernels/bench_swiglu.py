"""Benchmark: the SwiGLU kernel against eager `F.silu(gate) * up`, at the MLP widths of the
demo target and of Qwen3-8B."""

from __future__ import annotations

import torch

from ddtree.kernels.swiglu import silu_mul, silu_mul_reference
from tests.kernels.timing import compare, floor_us

INNER = {"smollm2": 1536, "qwen3": 12288}
ROW_COUNTS = (1, 65, 2048)


def bench_silu_mul(device: torch.device, inner_sizes: dict[str, int] = INNER,
                   row_counts: tuple[int, ...] = ROW_COUNTS,
                   dtype: torch.dtype = torch.bfloat16) -> list[dict]:
    rows = []
    for name, inner in inner_sizes.items():
        for num_rows in row_counts:
            gate_up = torch.randn(num_rows, 2 * inner, device=device).to(dtype)
            times = compare(lambda g=gate_up: silu_mul(g), lambda g=gate_up: silu_mul_reference(g),
                            device)
            moved = 3 * num_rows * inner * dtype.itemsize
            rows.append({"kernel": "silu_mul", "case": f"{name} I={inner}", "T": num_rows,
                         "floor_us": floor_us(moved), **times})
    return rows


if __name__ == "__main__":
    for row in bench_silu_mul(torch.device("cuda")):
        print(row)
