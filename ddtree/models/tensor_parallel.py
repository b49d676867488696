"""Tensor parallelism for the target (Megatron-style, over torch.distributed).

Sharding, in place after loading: each rank keeps `Hq/tp` query heads and `Hkv/tp` KV
heads (the fused [q | k | v] GEMM is column-parallel by heads, so GQA groups stay whole
on one rank), the matching columns of `o_proj` (row-parallel: partial sums, then one
all-reduce), `I/tp` rows of gate/up (column-parallel) and the matching columns of
`down_proj` (row-parallel + all-reduce). Embeddings, norms and the LM head are replicated
(the simplest choice: every rank holds the full vocabulary; only rank 0 computes logits).
A rank's KV pool holds only its KV heads. The kernels run unchanged on the shards.

The rank model (docs/architecture.md, "Tensor parallelism"): rank 0 (the leader) runs the
engine exactly as without TP; every target forward, pool creation and pool compaction it
does is first broadcast to the followers (`announce_*`), which replay it on their shards
in `follow`. The round is still written once, in ddtree/engine/round.py.

The all-reduces change the order of the sums: in bf16 TP-2 tokens need not equal TP-1; in
float32 they agree at T=0 (tests/unit/test_tensor_parallel.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ddtree.errors import InvalidArgumentError
from ddtree.models.kv_pool import KVPool
from ddtree.models.meta import AttentionMeta
from ddtree.models.ops import Backend
from ddtree.models.target import DecoderLayer, TargetModel, load_target
from ddtree.models.target_config import TargetConfig

# The leader's messages: a fixed-size int64 header [op, pool id, a, b, c], then a payload.
OP_STOP, OP_POOL, OP_FORWARD, OP_COMPACT = range(4)
HEADER_LEN = 5
META_FIELDS = ("positions", "write_slot", "write_pos", "query_slot", "prefix_len",
               "tree_base", "num_tree_keys")


def check_shardable(config: TargetConfig, world_size: int) -> None:
    """Raises InvalidArgumentError unless `world_size` ranks can split the target evenly."""
    if world_size < 1:
        raise InvalidArgumentError(f"tensor-parallel size must be >= 1, got {world_size}")
    for name, count in (("num_attention_heads", config.num_heads),
                        ("num_key_value_heads", config.num_kv_heads),
                        ("intermediate_size", config.intermediate_size)):
        if count % world_size:
            raise InvalidArgumentError(
                f"tensor-parallel size {world_size} does not divide the target's {name} "
                f"({count}); use a size that divides {config.num_heads} query heads, "
                f"{config.num_kv_heads} KV heads and intermediate size "
                f"{config.intermediate_size}")


@dataclass(frozen=True, eq=False)
class TensorParallel:
    """This process's place in the group. The default process group carries the tensors
    (on `device`: cuda:i with NCCL, the CPU with gloo); `control`, a gloo group, carries
    the leader's headers from host to host, so a follower learns what comes next without
    waiting for the leader's GPU and enqueues its work as far ahead as the leader does."""

    rank: int
    world_size: int
    device: torch.device
    control: dist.ProcessGroup | None = None  # None: the default group (tests on the CPU)

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: Tensor) -> Tensor:
        """Sums the ranks' partial results of a row-parallel layer, in place."""
        dist.all_reduce(x)
        return x

    # ------------------------------------------------------------ leader -> followers

    def _send(self, header: list[int], payload: Tensor | None = None) -> None:
        assert self.is_leader
        assert not (self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()), \
            "tensor-parallel forwards run eagerly: the followers' inputs come from the host"
        padded = header + [0] * (HEADER_LEN - len(header))
        dist.broadcast(torch.tensor(padded, dtype=torch.long), src=0, group=self.control)
        if payload is not None:
            dist.broadcast(payload.to(self.device, torch.long).contiguous(), src=0)

    def receive_header(self) -> list[int]:
        header = torch.empty(HEADER_LEN, dtype=torch.long)  # on the host: no device sync
        dist.broadcast(header, src=0, group=self.control)
        return [int(x) for x in header.tolist()]

    def receive_payload(self, numel: int) -> Tensor:
        payload = torch.empty(numel, dtype=torch.long, device=self.device)
        dist.broadcast(payload, src=0)
        return payload

    def new_pool(self, num_layers: int, num_slots: int, max_len: int, num_kv_heads: int,
                 head_dim: int, device: torch.device, dtype: torch.dtype) -> KVPool:
        """This rank's pool; the leader's tells the followers to make theirs."""
        if not self.is_leader:
            return KVPool(num_layers, num_slots, max_len, num_kv_heads, head_dim, device, dtype)
        pool = MirroredKVPool(self, num_layers, num_slots, max_len, num_kv_heads, head_dim,
                              device, dtype)
        self._send([OP_POOL, pool.pool_id, num_slots, max_len])
        return pool

    def announce_forward(self, pool: KVPool, input_ids: Tensor, meta: AttentionMeta) -> None:
        """input_ids: (T,); the followers run the same tokens against their pool."""
        assert isinstance(pool, MirroredKVPool), "a leader's forward needs a pool it made"
        num_tokens, num_keys = meta.tree_keys.shape
        fields = [input_ids] + [getattr(meta, name) for name in META_FIELDS]
        payload = torch.cat([f.reshape(-1) for f in fields] + [meta.tree_keys.reshape(-1)])
        self._send([OP_FORWARD, pool.pool_id, num_tokens, num_keys, meta.max_kv_len], payload)

    def announce_compact(self, pool_id: int, slots: Tensor, start: Tensor,
                         keep: Tensor) -> None:
        batch, width = keep.shape
        payload = torch.cat([slots.reshape(-1), start.reshape(-1), keep.reshape(-1)])
        self._send([OP_COMPACT, pool_id, batch, width], payload)

    def stop_followers(self) -> None:
        self._send([OP_STOP])


class MirroredKVPool(KVPool):
    """The leader's pool: every compaction is replayed on the followers' pools first."""

    _next_id = 0

    def __init__(self, tp: TensorParallel, num_layers: int, num_slots: int, max_len: int,
                 num_kv_heads: int, head_dim: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__(num_layers, num_slots, max_len, num_kv_heads, head_dim, device, dtype)
        self.tp = tp
        self.pool_id = MirroredKVPool._next_id
        MirroredKVPool._next_id += 1

    def compact(self, slots: Tensor, start: Tensor, keep: Tensor) -> None:
        self.tp.announce_compact(self.pool_id, slots, start, keep)
        super().compact(slots, start, keep)


@torch.inference_mode()
def follow(target: TargetModel, tp: TensorParallel) -> None:
    """A follower's loop: replays the leader's pools, forwards and compactions on this
    rank's shard until the leader says stop. Followers never compute logits."""
    assert not tp.is_leader and target.tp is tp
    pools: dict[int, KVPool] = {}
    while True:
        op, pool_id, a, b, c = tp.receive_header()
        if op == OP_STOP:
            return
        if op == OP_POOL:
            pools[pool_id] = target.new_pool(a, b)
        elif op == OP_FORWARD:
            input_ids, meta = _unpack_forward(tp.receive_payload(a * (1 + len(META_FIELDS) + b)),
                                              a, b, c)
            target.run_layers(input_ids, meta, pools[pool_id])
        elif op == OP_COMPACT:
            payload = tp.receive_payload(a * (2 + b))
            slots, start, keep = payload.split([a, a, a * b])
            pools[pool_id].compact(slots, start, keep.view(a, b))
        else:
            raise AssertionError(f"unknown tensor-parallel op {op}")


def _unpack_forward(payload: Tensor, num_tokens: int, num_keys: int,
                    max_kv_len: int) -> tuple[Tensor, AttentionMeta]:
    parts = payload.split([num_tokens] * (1 + len(META_FIELDS)) + [num_tokens * num_keys])
    fields = dict(zip(META_FIELDS, parts[1:-1], strict=True))
    meta = AttentionMeta(**fields, tree_keys=parts[-1].view(num_tokens, num_keys),
                         max_kv_len=max_kv_len)
    return parts[0], meta


# ------------------------------------------------------------------ sharding

def shard_target(model: TargetModel, tp: TensorParallel) -> TargetModel:
    """Keeps this rank's heads and MLP columns (see the module docstring), in place, and
    re-fuses the QKV and gate/up weights from the shards."""
    check_shardable(model.config, tp.world_size)
    rank, world = tp.rank, tp.world_size
    for module in model.layers:
        layer = cast(DecoderLayer, module)
        attn, mlp = layer.self_attn, layer.mlp
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj):
            _keep_output_rows(proj, rank, world)
        for proj in (attn.o_proj, mlp.down_proj):
            _keep_input_columns(proj, rank, world)
        attn.num_heads //= world
        attn.num_kv_heads //= world
        attn.fuse()
        mlp.fuse(share=True)
    model.tp = tp
    return model


def _keep_output_rows(linear: nn.Linear, rank: int, world: int) -> None:
    """Column-parallel: this rank's contiguous block of output features (whole heads)."""
    linear.weight = nn.Parameter(linear.weight.detach().chunk(world, 0)[rank].contiguous(),
                                 requires_grad=False)
    if linear.bias is not None:
        linear.bias = nn.Parameter(linear.bias.detach().chunk(world)[rank].contiguous(),
                                   requires_grad=False)
    linear.out_features = linear.weight.shape[0]


def _keep_input_columns(linear: nn.Linear, rank: int, world: int) -> None:
    """Row-parallel: this rank's block of input features; the bias is added once (on
    rank 0) so the all-reduce sums it exactly once."""
    linear.weight = nn.Parameter(linear.weight.detach().chunk(world, 1)[rank].contiguous(),
                                 requires_grad=False)
    if linear.bias is not None and rank != 0:
        linear.register_parameter("bias", None)
    linear.in_features = linear.weight.shape[1]


def load_target_shard(path: Path | str, device: torch.device, dtype: torch.dtype,
                      tp: TensorParallel, invariant: bool = True) -> TargetModel:
    """This rank's shard of the target in `path`. The whole checkpoint is read into host
    memory first (so a GPU never holds more than its shard), sharded, then moved."""
    model = load_target(path, "cpu", dtype)
    shard_target(model, tp)
    model.to(device)
    model.embeddings.tie()
    model.fuse_weights()  # the fused weights are plain tensors: `to` did not move them
    model.backend = Backend.for_device(device, invariant)
    return model
