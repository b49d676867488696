"""Benchmark: the one-pass RoPE + KV-store kernel against its eager reference, with the
heads of the demo target (no head norm) and of Qwen3-8B (q_norm, k_norm)."""

from __future__ import annotations

import torch

from ddtree.kernels.rope import rope_store, rope_store_reference
from tests.kernels.timing import compare, floor_us

HEADS = {"smollm2": (9, 3, 64, False), "qwen3": (32, 8, 128, True)}  # Hq, Hkv, D, norms
ROW_COUNTS = (1, 65, 2048)


def bench_rope_store(device: torch.device,
                     heads: dict[str, tuple[int, int, int, bool]] = HEADS,
                     row_counts: tuple[int, ...] = ROW_COUNTS,
                     dtype: torch.dtype = torch.bfloat16) -> list[dict]:
    rows = []
    for name, (num_heads, num_kv_heads, head_dim, with_norm) in heads.items():
        for num_rows in row_counts:
            args = rope_inputs(device, num_rows, num_heads, num_kv_heads, head_dim, with_norm,
                               dtype)
            times = compare(lambda a=args: rope_store(**a),
                            lambda a=args: rope_store_reference(**a), device)
            moved = 2 * args["qkv"].numel() * dtype.itemsize  # qkv in; q, k, v out
            rows.append({"kernel": "rope_store", "case": name, "T": num_rows,
                         "floor_us": floor_us(moved), **times})
    return rows


def rope_inputs(device: torch.device, num_rows: int, num_heads: int, num_kv_heads: int,
                head_dim: int, with_norm: bool, dtype: torch.dtype) -> dict:
    """rope_store's arguments: rows written to distinct slots of a 4-row pool."""
    max_len = max(64, num_rows)
    pool = torch.zeros(2, 4, max_len, num_kv_heads, head_dim, device=device, dtype=dtype)
    norm = (torch.ones(head_dim, device=device, dtype=dtype) if with_norm else None)
    return dict(
        qkv=torch.randn(num_rows, (num_heads + 2 * num_kv_heads) * head_dim,
                        device=device).to(dtype),
        positions=torch.arange(num_rows, device=device) + 100,
        inv_freq=1.0 / (1e6 ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)),
        k_cache=pool[0], v_cache=pool[1],
        write_slot=torch.arange(num_rows, device=device) % 4,
        write_pos=torch.arange(num_rows, device=device) // 4,
        num_heads=num_heads, num_kv_heads=num_kv_heads,
        q_norm_weight=norm, k_norm_weight=norm,
    )


if __name__ == "__main__":
    for row in bench_rope_store(torch.device("cuda")):
        print(row)
