# ruff: noqa: B023 (each case runs inside its own loop iteration)
"""The norm after a projection, on its own and in the projection's split-K reduce
(`fused_linear.linear_norm`), at the demo's and the Qwen3-8B's shapes: graph replay, us per
call, each beside the GEMM alone and the GEMM then `rms_norm`. Run on the GPU machine:

    python3 scripts/gpu/norm_bench.py        # table on stdout, /tmp/norm_bench.json
"""

from __future__ import annotations

import json
import sys

import torch

sys.path.insert(0, ".")

from ddtree.kernels.fused_linear import linear_norm  # noqa: E402
from ddtree.kernels.matmul import LinearConfig, linear_config, linear_with_config  # noqa: E402
from ddtree.kernels.rmsnorm import rms_norm  # noqa: E402
from tests.kernels.timing import graph_replay_us  # noqa: E402

BF16 = torch.bfloat16
# name: (N, K, tiling or None for the committed one)
PROJECTIONS = {
    "demo down 576x1536": (576, 1536, None),
    "demo o 576x576, split 3": (576, 576, LinearConfig(64, 32, 64, 3, 4, 4)),
    "8B o 4096x4096": (4096, 4096, None),
    "8B down 4096x12288": (4096, 12288, None),
}


def main() -> None:
    torch.manual_seed(0)
    rows = []
    for name, (n, k, config) in PROJECTIONS.items():
        weight = (torch.randn(n, k, device="cuda") / 64).to(BF16)
        norm_weight = torch.ones(n, device="cuda", dtype=BF16)
        config = config or linear_config(n, k, BF16)
        for num_rows in (1, 17, 64):
            x = torch.randn(num_rows, k, device="cuda").to(BF16)
            residual = torch.randn(num_rows, n, device="cuda").to(BF16)
            fused = linear_norm(x, weight, None, residual, norm_weight, 1e-6, config)
            assert fused is not None
            plain = linear_with_config(x, weight, None, None, config)
            separate = rms_norm(plain, norm_weight, 1e-6, residual)
            same = torch.equal(fused[0], separate[0]) and torch.equal(fused[1], separate[1])
            cases = {
                "linear": lambda: linear_with_config(x, weight, None, None, config),
                "linear + rms_norm": lambda: rms_norm(
                    linear_with_config(x, weight, None, None, config), norm_weight, 1e-6,
                    residual),
                "linear_norm": lambda: linear_norm(x, weight, None, residual, norm_weight,
                                                   1e-6, config),
            }
            times = {case: round(graph_replay_us(fn), 2) for case, fn in cases.items()}
            rows.append({"projection": name, "rows": num_rows, "bitwise": same, **times})
            print(f"{name:<26} T={num_rows:<3} " + "  ".join(
                f"{case} {us:7.2f}" for case, us in times.items()) + f"  bitwise {same}",
                flush=True)
    json.dump(rows, open("/tmp/norm_bench.json", "w"), indent=1)


if __name__ == "__main__":
    main()
