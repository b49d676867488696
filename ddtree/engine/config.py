"""The engine's configuration and the plan of its memory: how many pool rows fit, and the
static shapes (batch buckets x node buckets) rounds are captured in."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ddtree.errors import InvalidArgumentError
from ddtree.models.kv_pool import KVPool
from ddtree.models.target_config import TargetConfig

# Without a GPU the pool comes out of host memory: stay modest by default.
CPU_KV_BYTES = 2 << 30
# On a GPU: this fraction of the memory free once the models are loaded.
GPU_KV_FRACTION = 0.5
# Tree sizes (nodes besides the root) the round's buffers and graphs come in. 63 and 127
# beside 64 and 128 (auto's sizes, policy.TREE_SIZES): a tree of 63 nodes verifies 64 rows,
# one 64-row tile of every GEMM; in the 64-node bucket it verified 65, two tiles that each
# read the weight (Qwen3-8B shapes: ~2 ms of an 8.7 ms verify, lease 10). Each size is
# one more drafter warm-up compile (drafter_svc) and graph per batch bucket.
NODE_BUCKETS = (16, 32, 63, 64, 127, 128, 256, 512, 1024)


@dataclass(frozen=True)
class EngineConfig:
    """max_num_seqs: generations (and client sessions) holding a pool row at once;
    max_queue: admitted requests waiting for a row (more get CapacityError -> 429);
    max_model_len: prompt + generated tokens per row (0 = the target's);
    kv_memory_bytes: the pool's budget (0 = auto); max_budget: largest tree a request may
    ask for; cuda_graphs / invariant: capture rounds / batch-invariant GEMMs (GPU only);
    fused_prologues: each layer's two norms and SwiGLU run inside its invariant GEMMs (GPU
    only, same bits as the separate kernels, three launches fewer per layer; off = the
    separate kernels, the default: the fused GEMMs measured slower on the H200);
    max_prefill_tokens: prompt tokens prefilled per step before the round runs;
    static_prefill: prefill in padded static shapes (ddtree/engine/prefill_graphs.py),
    replayed as CUDA graphs; None = exactly when rounds are captured (a GPU with graphs);
    measure_policy: time every `auto` choice's round (graphs replayed on scratch rows) when
    a batch bucket first carries auto rows; None = when rounds are captured (a GPU);
    pipeline: launch each round before reading the previous one (see Engine.step);
    fast_ar: greedy rounds of ar rows only skip the one-node tree walk and the compaction
    (`round._verify_greedy_ar`; same tokens and pool; off = the generic walk);
    alternate: with a remote drafter and drafting rows in both halves of the batch, the
    halves take turns (one verifies while the other's trees are drafted; Engine.step);
    off by default: measured slower on the H200 (docs/performance.md, fourth session);
    send_ahead: with a remote drafter (not alternating), each round's next trees are asked
    for right after its harvest, so the drafter drafts while the host delivers, admits
    and launches (Engine._send_ahead);
    swiglu_epilogue: the gate_up GEMM stores silu(gate) * up itself (same bits as the GEMM
    then silu_mul, one launch fewer per layer; the target's layers and a local drafter's);
    reduce_fusions: the norm after o_proj / down (and the residual add) runs in that GEMM's
    split-K reduce kernel where its tiling splits K (same bits, one launch fewer each;
    the target's layers and a local drafter's; `ops.join_residual`);
    rope_epilogue: RoPE and the KV store run as the QKV GEMM's epilogue where that GEMM
    does not split K and the model has no head norms (same bits, one launch fewer per
    layer; ddtree/kernels/rope.py);
    round_commit: a round whose rows all walk greedily builds its tree metadata, takes
    the argmax, walks, commits and compacts the KV pool in Triton kernels instead of ~100
    PyTorch launches (same tables, state and pool; ddtree/kernels/round_commit.py)."""

    max_num_seqs: int = 64
    max_queue: int = 1024
    max_model_len: int = 0
    kv_memory_bytes: int = 0
    max_budget: int = 256
    cuda_graphs: bool = True
    invariant: bool = True
    fused_prologues: bool = False
    max_prefill_tokens: int = 8192
    static_prefill: bool | None = None
    measure_policy: bool | None = None
    pipeline: bool = True
    fast_ar: bool = True
    alternate: bool = False
    send_ahead: bool = True
    swiglu_epilogue: bool = True
    reduce_fusions: bool = True
    rope_epilogue: bool = True
    round_commit: bool = True

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_queue < 0:
            raise InvalidArgumentError("max_num_seqs must be >= 1 and max_queue >= 0")
        if self.max_model_len < 0 or self.kv_memory_bytes < 0 or self.max_budget < 1:
            raise InvalidArgumentError(
                "max_model_len and kv_memory_bytes must be >= 0, max_budget >= 1")
        if self.max_prefill_tokens < 1:
            raise InvalidArgumentError("max_prefill_tokens must be >= 1")


@dataclass(frozen=True)
class PoolPlan:
    """num_slots rows of max_len token slots; the static shapes rounds run in."""

    num_slots: int
    max_model_len: int
    max_len: int
    batch_buckets: tuple[int, ...]
    node_buckets: tuple[int, ...]

    def batch_bucket(self, num_rows: int) -> int:
        return next(b for b in self.batch_buckets if b >= num_rows)

    def node_bucket(self, num_nodes: int) -> int:
        if num_nodes == 0:
            return 0
        return next(n for n in self.node_buckets if n >= num_nodes)


def plan_pool(config: EngineConfig, target: TargetConfig, device: torch.device,
              dtype: torch.dtype, per_token_extra: int, draft_depth: int) -> PoolPlan:
    """Sizes the pool: rows of `max_model_len` + one tree, as many as the memory budget
    allows up to max_num_seqs. per_token_extra: bytes per token slot of the drafter's
    context pool (0 without a local drafter). draft_depth: L (0 without a drafter)."""
    max_model_len = config.max_model_len or target.max_position_embeddings
    max_nodes = max(config.max_budget, draft_depth)
    # A row may commit up to L tokens past its last emitted one, and a pipelined round may
    # still verify one more tree after it finished.
    max_len = max_model_len + draft_depth + 2 * (max_nodes + 1)
    per_token = KVPool.bytes_per_token(target.num_layers, target.num_kv_heads,
                                       target.head_dim, dtype) + per_token_extra
    budget = config.kv_memory_bytes or _auto_budget(device)
    num_slots = min(config.max_num_seqs, budget // (per_token * max_len))
    if num_slots < 1:
        raise InvalidArgumentError(
            f"the KV budget of {budget / 2**30:.2f} GiB holds no row of {max_len} tokens "
            f"({per_token * max_len / 2**30:.2f} GiB each): lower --max-model-len or raise "
            "the KV memory budget")
    batches = sorted({b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b < num_slots}
                     | {num_slots})
    nodes = {n for n in NODE_BUCKETS if n < max_nodes} | {max_nodes}
    if draft_depth:
        nodes.add(draft_depth)
    return PoolPlan(num_slots, max_model_len, max_len, tuple(batches), tuple(sorted(nodes)))


def _auto_budget(device: torch.device) -> int:
    if device.type != "cuda":
        return CPU_KV_BYTES
    free, _ = torch.cuda.mem_get_info(device)
    return int(free * GPU_KV_FRACTION)
