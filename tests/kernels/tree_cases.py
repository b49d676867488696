"""Attention inputs for the kernel tests and the GPU check: draft-tree topologies, and KV
pools in which every tree query has an ar twin whose logical key sequence holds the same
values (the contract: equal logical keys, bitwise equal outputs)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

# A parents list: node 0 is the root (parent -1), parents[i] < i for the others.


def chain(num_nodes: int) -> list[int]:
    return [-1] + list(range(num_nodes - 1))


def star(num_nodes: int) -> list[int]:
    return [-1] + [0] * (num_nodes - 1)


def random_tree(num_nodes: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, num_nodes)]


def ancestor_paths(parents: list[int]) -> list[list[int]]:
    """Each node's ancestors root first, ending with the node itself (depth + 1 entries)."""
    paths: list[list[int]] = []
    for node, parent in enumerate(parents):
        paths.append([node] if parent < 0 else paths[parent] + [node])
    return paths


@dataclass
class Queries:
    """One launch's queries and metadata: q (T, Hq, D); the rest as tree_attention takes
    them."""

    q: Tensor
    query_slot: Tensor
    prefix_len: Tensor
    tree_base: Tensor
    tree_keys: Tensor
    num_tree_keys: Tensor

    def lengths(self) -> Tensor:
        return self.prefix_len.long() + self.num_tree_keys.long()

    def select(self, index: Tensor) -> Queries:
        return Queries(*(field[index] for field in self.fields()))

    def fields(self) -> tuple[Tensor, ...]:
        return (self.q, self.query_slot, self.prefix_len, self.tree_base, self.tree_keys,
                self.num_tree_keys)

    def to(self, device: torch.device | str) -> Queries:
        return Queries(*(field.to(device) for field in self.fields()))


def concat(parts: list[Queries]) -> Queries:
    width = max(part.tree_keys.shape[1] for part in parts)
    keys = [torch.nn.functional.pad(part.tree_keys, (0, width - part.tree_keys.shape[1]),
                                    value=int(part.tree_keys.max()) if part.tree_keys.numel()
                                    else 0) for part in parts]
    fields = [torch.cat([part.fields()[i] for part in parts]) for i in (0, 1, 2, 3, 5)]
    return Queries(*fields[:4], torch.cat(keys), fields[4])


@dataclass
class TwinCase:
    """A pool layer (k_cache, v_cache) with tree queries and their ar twins (same index)."""

    k_cache: Tensor
    v_cache: Tensor
    tree: Queries
    ar: Queries


def twin_case(
    trees: list[tuple[list[int], int]], num_heads: int, num_kv_heads: int, head_dim: int,
    dtype: torch.dtype, seed: int = 0, index_dtype: torch.dtype = torch.int64,
    device: str = "cpu",
) -> TwinCase:
    """trees: (parents, committed length n) per request. Request r gets one pool row
    holding its prefix at slots [0, n) and node i at slot n + i; each node gets an ar row
    holding the same prefix followed by its ancestors' K/V at n, n + 1, ... Every slot
    nothing wrote holds NaN, and padded tree-key columns point at such a slot, so a kernel
    that reads a key outside a query's logical sequence returns NaN."""
    gen = torch.Generator().manual_seed(seed)
    max_len = max(n + 2 * len(parents) + 2 for parents, n in trees)
    num_rows = sum(1 + len(parents) for parents, _ in trees)
    shape = (2, num_rows, max_len, num_kv_heads, head_dim)  # (layers, rows, slots, Hkv, D)
    k_pool = torch.full(shape, float("nan"), dtype=dtype, device=device)
    v_pool = torch.full(shape, float("nan"), dtype=dtype, device=device)
    k_cache, v_cache = k_pool[1], v_pool[1]  # one layer: a view with an offset

    def rand(*size: int) -> Tensor:
        return torch.randn(*size, generator=gen).to(device=device, dtype=dtype)

    tree_parts, ar_parts, row = [], [], 0
    for parents, n in trees:
        num_nodes, paths = len(parents), ancestor_paths(parents)
        prefix_k, prefix_v = rand(n, num_kv_heads, head_dim), rand(n, num_kv_heads, head_dim)
        node_k, node_v = rand(num_nodes, num_kv_heads, head_dim), rand(num_nodes, num_kv_heads,
                                                                        head_dim)
        tree_row, ar_rows = row, range(row + 1, row + 1 + num_nodes)
        row += 1 + num_nodes
        for cache, prefix, nodes in ((k_cache, prefix_k, node_k), (v_cache, prefix_v, node_v)):
            cache[tree_row, :n], cache[tree_row, n:n + num_nodes] = prefix, nodes
            for node, ar_row in zip(range(num_nodes), ar_rows, strict=True):
                cache[ar_row, :n] = prefix
                cache[ar_row, n:n + len(paths[node])] = nodes[torch.tensor(paths[node])]
        q = rand(num_nodes, num_heads, head_dim)
        nan_col = num_nodes + 1  # slot n + N + 1 of the tree row was never written
        keys = torch.full((num_nodes, num_nodes), nan_col, dtype=torch.long)
        for node, path in enumerate(paths):
            keys[node, :len(path)] = torch.tensor(path)
        depth1 = torch.tensor([len(path) for path in paths])
        full = torch.full((num_nodes,), n)
        tree_parts.append(Queries(q.cpu(), torch.full((num_nodes,), tree_row), full, full, keys,
                                  depth1))
        nan_key = torch.full((num_nodes, 1), max_len - 4)  # tree_base 3: the row's last slot
        ar_parts.append(Queries(q.cpu(), torch.tensor(list(ar_rows)), n + depth1,
                                torch.full((num_nodes,), 3), nan_key,
                                torch.zeros(num_nodes, dtype=torch.long)))

    def finish(parts: list[Queries]) -> Queries:
        joined = concat(parts)
        ints = [field.to(index_dtype).contiguous() for field in joined.fields()[1:]]
        return Queries(joined.q, *ints).to(device)

    return TwinCase(k_cache, v_cache, finish(tree_parts), finish(ar_parts))
