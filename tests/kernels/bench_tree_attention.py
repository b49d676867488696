"""Benchmark: tree_attention against torch SDPA with a boolean ancestor mask at equal
tokens: B requests of a T-node random tree over a committed context, with the heads of the
demo target and of Qwen3-8B. SDPA gets its K/V contiguous per request and already expanded
to the query heads (no pool gather, no repeat: a favour to it). Run through
scripts/gpu/check_kernels.py or `python -m tests.kernels.bench_tree_attention`."""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F

from ddtree.kernels.tree_attention import BLOCK_N, PREFIX_LOOP, SPLIT_SIZE, tree_attention_tiled
from tests.kernels.timing import compare, floor_us, num_copies, rotating
from tests.kernels.tree_cases import ancestor_paths, random_tree

HEADS = {"smollm2": (9, 3, 64), "qwen3": (32, 8, 128)}  # Hq, Hkv, D


def tree_batch(num_requests: int, num_nodes: int, context: int,
               device: torch.device) -> dict[str, torch.Tensor]:
    """Metadata of B requests (pool row b, committed length `context`) each verifying a
    random tree of `num_nodes` nodes stored at slots context + i, and the SDPA mask."""
    paths = ancestor_paths(random_tree(num_nodes, seed=num_nodes))
    keys = torch.zeros(num_nodes, num_nodes, dtype=torch.int32)
    visible = torch.zeros(num_nodes, context + num_nodes, dtype=torch.bool)
    visible[:, :context] = True
    for node, path in enumerate(paths):
        keys[node, :len(path)] = torch.tensor(path, dtype=torch.int32)
        visible[node, context + torch.tensor(path)] = True
    depth1 = torch.tensor([len(path) for path in paths], dtype=torch.int32)
    rows = torch.arange(num_requests, dtype=torch.int32).repeat_interleave(num_nodes)
    total = num_requests * num_nodes
    full = torch.full((total,), context, dtype=torch.int32)
    meta = {"query_slot": rows, "prefix_len": full, "tree_base": full,
            "tree_keys": keys.repeat(num_requests, 1), "num_tree_keys": depth1.repeat(num_requests),
            "mask": visible[None, None].expand(num_requests, 1, -1, -1)}
    return {name: value.to(device) for name, value in meta.items()}


def bench_tree_attention(
    device: torch.device, heads: dict[str, tuple[int, int, int]] = HEADS,
    num_requests: tuple[int, ...] = (1, 8), contexts: tuple[int, ...] = (512, 4096),
    num_nodes: tuple[int, ...] = (1, 16, 65), dtype: torch.dtype = torch.bfloat16,
) -> list[dict]:
    rows = []
    for name, (num_heads, num_kv_heads, head_dim) in heads.items():
        for batch, context, nodes in itertools.product(num_requests, contexts, num_nodes):
            rows.append({"kernel": "tree_attention", "case": f"{name} B={batch} S={context}",
                         "T": nodes, **_one(device, num_heads, num_kv_heads, head_dim, batch,
                                            context, nodes, dtype)})
    return rows


TILES = ((64, 512, True), (64, 512, False), (64, 256, True), (64, 1024, True), (32, 512, True))


def bench_tiles(device: torch.device, tiles: tuple[tuple[int, int, bool], ...] = TILES,
                shapes: tuple[tuple[int, int, int], ...] = ((1, 512, 1), (1, 4096, 1),
                                                            (8, 4096, 65)),
                heads: tuple[str, tuple[int, int, int]] = ("qwen3", HEADS["qwen3"]),
                dtype: torch.dtype = torch.bfloat16) -> list[dict]:
    """Tuning data: other (BLOCK_N, SPLIT_SIZE, PREFIX_LOOP) settings at (B, S, T) shapes
    (each setting is its own invariant kernel)."""
    rows = []
    for tile, (batch, context, nodes) in itertools.product(tiles, shapes):
        loops = "2 loops" if tile[2] else "1 loop"
        rows.append({"kernel": f"attn {tile[0]}/{tile[1]} {loops}",
                     "case": f"{heads[0]} B={batch} S={context}", "T": nodes,
                     **_one(device, *heads[1], batch, context, nodes, dtype, tile)})
    return rows


def _one(device: torch.device, num_heads: int, num_kv_heads: int, head_dim: int, batch: int,
         context: int, nodes: int, dtype: torch.dtype,
         tiles: tuple[int, int, bool] = (BLOCK_N, SPLIT_SIZE, PREFIX_LOOP)) -> dict[str, float]:
    meta = tree_batch(batch, nodes, context, device)
    length = context + nodes
    kv_bytes = 2 * batch * length * num_kv_heads * head_dim * dtype.itemsize
    copies = num_copies(kv_bytes, device)
    pools = [torch.randn(2, batch, length, num_kv_heads, head_dim, device=device).to(dtype)
             for _ in range(copies)]  # (K/V, B, S, Hkv, D)
    group = num_heads // num_kv_heads  # SDPA's fast kernels want the heads expanded
    dense = [pool.transpose(2, 3).repeat_interleave(group, dim=2)
             for pool in pools[:num_copies(kv_bytes * group, device)]]  # (K/V, B, Hq, S, D)
    q = torch.randn(batch * nodes, num_heads, head_dim, device=device).to(dtype)
    q_dense = q.view(batch, nodes, num_heads, head_dim).transpose(1, 2).contiguous()
    scale = 1 / math.sqrt(head_dim)
    index = [meta[key] for key in ("query_slot", "prefix_len", "tree_base", "tree_keys",
                                   "num_tree_keys")]
    ours = rotating([lambda p=p: tree_attention_tiled(q, p[0], p[1], *index, scale, length,
                                                      *tiles) for p in pools])
    sdpa = rotating([lambda d=d: F.scaled_dot_product_attention(
        q_dense, d[0], d[1], attn_mask=meta["mask"], scale=scale) for d in dense])
    return {"floor_us": floor_us(kv_bytes + 2 * q.numel() * dtype.itemsize),
            **compare(ours, sdpa, device)}


if __name__ == "__main__":
    for row in bench_tree_attention(torch.device("cuda")):
        print(row)
