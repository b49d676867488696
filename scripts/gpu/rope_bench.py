# ruff: noqa: B023 (each case runs inside its own loop iteration)
"""RoPE and the KV store as the QKV GEMM's epilogue (`rope.rope_store` of a
`matmul.PendingLinear`) against the GEMM then `rope_store`, at the demo target's QKV and a
head-dim-128 shape: bitwise (q, the pool's k and v) and graph replay, us per call. Run on
the GPU machine:

    python3 scripts/gpu/rope_bench.py        # table on stdout, /tmp/rope_bench.json
"""

from __future__ import annotations

import json
import sys

import torch

sys.path.insert(0, ".")

from ddtree.kernels.matmul import PendingLinear, invariant_linear  # noqa: E402
from ddtree.kernels.rope import rope_epilogue_config, rope_store  # noqa: E402
from tests.kernels.timing import graph_replay_us  # noqa: E402

BF16 = torch.bfloat16
# name: (hidden, heads, KV heads, head dim)
SHAPES = {
    "demo QKV 960x576": (576, 9, 3, 64),
    "QKV 1536x1024, head dim 128": (1024, 8, 2, 128),
}


def main() -> None:
    torch.manual_seed(0)
    rows = []
    for name, (hidden, heads, kv_heads, head_dim) in SHAPES.items():
        width = (heads + 2 * kv_heads) * head_dim
        weight = (torch.randn(width, hidden, device="cuda") / 32).to(BF16)
        inv_freq = 1.0 / (1e4 ** (torch.arange(0, head_dim, 2, device="cuda").float()
                                  / head_dim))
        for num_rows in (1, 17, 64, 136, 300):
            x = torch.randn(num_rows, hidden, device="cuda").to(BF16)
            pools = [torch.full((2, 4, 512, kv_heads, head_dim), float("nan"), device="cuda",
                                dtype=BF16) for _ in range(2)]
            slot = torch.randint(0, 4, (num_rows,), device="cuda")
            pos = torch.randperm(512, device="cuda")[:num_rows]
            positions = torch.randint(0, 4000, (num_rows,), device="cuda")
            config = rope_epilogue_config(PendingLinear(x, weight, None), heads, kv_heads, False)

            def fused(pool: torch.Tensor = pools[0]) -> torch.Tensor:
                return rope_store(PendingLinear(x, weight, None), positions, inv_freq,
                                  pool[0], pool[1], slot, pos, heads, kv_heads)

            def separate(pool: torch.Tensor = pools[1]) -> torch.Tensor:
                return rope_store(invariant_linear(x, weight), positions, inv_freq, pool[0],
                                  pool[1], slot, pos, heads, kv_heads)

            q_fused, q_separate = fused(), separate()
            same = (torch.equal(q_fused, q_separate)
                    and torch.equal(pools[0].nan_to_num(), pools[1].nan_to_num())
                    and torch.equal(pools[0].isnan(), pools[1].isnan()))
            cases = {"linear": lambda: invariant_linear(x, weight),
                     "linear + rope_store": separate, "rope epilogue": fused}
            times = {case: round(graph_replay_us(fn), 2) for case, fn in cases.items()}
            rows.append({"shape": name, "rows": num_rows, "bitwise": same,
                         "tiling": str(config), **times})
            print(f"{name:<28} T={num_rows:<3} " + "  ".join(
                f"{case} {us:7.2f}" for case, us in times.items()) + f"  bitwise {same}",
                flush=True)
    json.dump(rows, open("/tmp/rope_bench.json", "w"), indent=1)


if __name__ == "__main__":
    main()
