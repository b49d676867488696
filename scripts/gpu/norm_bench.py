# ruff: noqa: B023 (each case runs inside its own loop iteration)
"""Where the fused norms' time goes on the GPU: each piece of `Backend.fused` against the
separate kernels, at the demo's and the Qwen3-8B's shapes, graph replay (us per call),
with each compiled kernel's registers and spills. Run on the GPU machine:

    python3 scripts/gpu/norm_bench.py
"""

from __future__ import annotations

import json
import sys

import torch

sys.path.insert(0, ".")

from ddtree.kernels import matmul, rmsnorm  # noqa: E402
from ddtree.kernels.fused_linear import (  # noqa: E402
    linear_swiglu,
    norm_linear,
    residual_linear,
    swiglu_epilogue_rows_config,
)
from ddtree.kernels.matmul import invariant_linear  # noqa: E402
from ddtree.kernels.rmsnorm import rms_norm  # noqa: E402
from tests.kernels.timing import graph_replay_us  # noqa: E402

BF16 = torch.bfloat16
SHAPES = {  # hidden, qkv width, intermediate
    "demo": (576, 960, 1536),
    "8B": (4096, 6144, 12288),
}


def kernel_stats() -> dict[str, list[str]]:
    """n_regs / n_spills of every compiled variant of our kernels (triton internals)."""
    out: dict[str, list[str]] = {}
    for name, fn in (("rms_norm", rmsnorm._rms_norm_kernel), ("linear", matmul._linear_kernel),
                     ("reduce", matmul._split_k_reduce_kernel)):
        seen = []
        try:
            for cache in fn.device_caches.values():
                for kernel in cache[0].values():
                    seen.append(f"regs {kernel.n_regs} spills {kernel.n_spills} "
                                f"shared {kernel.metadata.shared}")
        except Exception as error:  # noqa: BLE001 - a tool: say what failed
            seen.append(repr(error))
        out[name] = seen
    return out


def main() -> None:
    torch.manual_seed(0)
    rows: list[dict] = []
    for model, (hidden, qkv_width, inner) in SHAPES.items():
        dev = "cuda"
        norm_w = torch.ones(hidden, device=dev, dtype=BF16)
        w_o = torch.randn(hidden, hidden, device=dev).to(BF16) / 64
        w_down = torch.randn(hidden, inner, device=dev).to(BF16) / 64
        w_qkv = torch.randn(qkv_width, hidden, device=dev).to(BF16) / 64
        w_gu = torch.randn(2 * inner, hidden, device=dev).to(BF16) / 64
        for num_rows in (1, 17, 64):
            x = torch.randn(num_rows, hidden, device=dev).to(BF16)
            r = torch.randn(num_rows, hidden, device=dev).to(BF16)
            act = torch.randn(num_rows, inner, device=dev).to(BF16)
            h, stats = residual_linear(x, w_o, None, r)
            config = swiglu_epilogue_rows_config(w_gu, num_rows)
            cases = {
                "rms_norm(x, residual)": lambda x=x, r=r: rms_norm(x, norm_w, 1e-6, r),
                "rms_norm(x)": lambda x=x: rms_norm(x, norm_w, 1e-6),
                "o: linear": lambda x=x: invariant_linear(x, w_o),
                "o: residual_linear": lambda x=x, r=r: residual_linear(x, w_o, None, r),
                "down: linear": lambda a=act: invariant_linear(a, w_down),
                "down: residual_linear": lambda a=act, r=r: residual_linear(a, w_down, None, r),
                "qkv: linear": lambda x=x: invariant_linear(x, w_qkv),
                "qkv: norm_linear": lambda h=h, s=stats: norm_linear(h, s, norm_w, 1e-6, w_qkv),
                "gate_up: linear_swiglu": lambda x=x, c=config: linear_swiglu(x, w_gu, c),
                "gate_up: norm_linear swiglu": lambda h=h, s=stats, c=config: norm_linear(
                    h, s, norm_w, 1e-6, w_gu, None, c, swiglu=True),
            }
            for name, fn in cases.items():
                fn()
                torch.cuda.synchronize()
                us = graph_replay_us(fn)
                rows.append({"model": model, "rows": num_rows, "case": name, "us": round(us, 2)})
                print(f"{model:>4} T={num_rows:<3} {name:<30} {us:8.2f} us", flush=True)
    stats_out = kernel_stats()
    for name, lines in stats_out.items():
        for line in lines:
            print(f"{name}: {line}")
    json.dump({"rows": rows, "kernels": stats_out}, open("/tmp/norm_bench.json", "w"), indent=1)


if __name__ == "__main__":
    main()
