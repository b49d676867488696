"""The few operations the models are made of, each dispatched to a Triton kernel on the GPU
or to its plain-PyTorch reference on the CPU (ddtree/kernels/).

`Backend.invariant` chooses the GEMM: the batch-invariant Triton matmul (every mode serves
the ar tokens bit for bit in bf16) or the GEMM library (cuBLAS; faster at some shapes,
but a row's result depends on how many rows share the call). Attention, norms and the
QKV prologue are invariant by construction on both paths. `Backend.fused` folds the norm
before the QKV and gate_up GEMMs and the SwiGLU before the down GEMM into those GEMMs
(ddtree/kernels/fused_linear.py: same bits, three launches fewer per layer); it applies
only to the invariant Triton GEMM, everything else runs the separate operations. It is
OFF by default: on the H200 it measured slower (ar 604 vs 763 tok/s, tree@32 971 vs 1,117
at batch 1, docs/performance.md), the per-program norm statistics lengthening every GEMM.
`Backend.swiglu_epilogue` (on) has the gate_up GEMM store silu(gate) * up itself instead
(`norm_swiglu_down`; an epilogue leaves the GEMM's main loop alone: faster on the H200).
`Backend.reduce_fusions` (on) folds a split-K GEMM's reduce into the operation after it,
where the tiling splits K: the norm after a projection that joins the residual stream
(o_proj, down) runs in that GEMM's reduce (`Stream`), and RoPE with the KV store finishes
the QKV GEMM's partial sums itself (`norm_linear(defer=True)`, `rope_store`).
`Backend.rope_epilogue` (on): where the QKV GEMM does not split K and the model has no
head norms, RoPE and the KV store run as that GEMM's epilogue (`norm_linear(defer=True)`
leaves the GEMM to `rope_store`; ddtree/kernels/rope.py), one launch fewer per layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from ddtree.kernels import fused_linear, matmul, rmsnorm, rope, swiglu, tree_attention
from ddtree.models.meta import AttentionMeta


@dataclass(frozen=True)
class Backend:
    """kernels: run the Triton kernels (a GPU, or the interpreter in kernel tests);
    invariant: batch-invariant GEMMs (only meaningful with kernels); fused: the norm and
    SwiGLU prologues inside those GEMMs (only meaningful with kernels and invariant);
    tree_build: a drafter's trees from one kernel (ddtree.kernels.tree_build; only with
    kernels; the same trees as without); vocab_topk: its vocabulary top-K from two
    (ddtree.kernels.vocab_topk; only with kernels; the same tokens as torch.topk's);
    reduce_fusions: the norm after o_proj / down in that GEMM's split-K reduce kernel
    (`join_residual`), RoPE on the QKV GEMM's split partials (`norm_linear`'s
    `defer`); only with kernels and invariant; the same bits as without;
    rope_epilogue: RoPE and the KV store as the QKV GEMM's epilogue where that GEMM does
    not split K and the model has no head norms (`norm_linear`'s `defer`, `rope_store`);
    only with kernels and invariant; the same bits as without;
    round_commit: the verify half's tree metadata, argmax, greedy walk, commit and KV
    compaction in Triton kernels (ddtree/kernels/round_commit.py) when every row of a
    round walks greedily; only with kernels; the same tables, state and pool as without;
    context_in_block: a drafter's new context rows projected in its block's QKV GEMM
    (`DFlashDrafter.draft`'s `context`: one read of each layer's QKV weight a round where
    appending the context first took two); only with kernels and invariant; the same bits
    as without;
    draft_prologue: a draft half's inputs (the rows' state columns and pending features,
    where the context rows and the blocks go, the blocks' embeddings) from two kernels
    (ddtree/kernels/draft_prologue.py) instead of ~30 PyTorch launches; only with kernels
    (the blocks' part with context_in_block); the same integers and bits as without;
    attn_tiles: another tiling of tree attention for this model (a constant of the model,
    so its modes still agree with each other only if the tiling keeps the kernel's
    invariance: engine_bench's exact stage decides, scripts/gpu/attn_sweep.py times)."""

    kernels: bool = False
    invariant: bool = True
    fused: bool = False
    swiglu_epilogue: bool = True
    reduce_fusions: bool = True
    rope_epilogue: bool = True
    tree_build: bool = True
    vocab_topk: bool = True
    round_commit: bool = True
    context_in_block: bool = True
    draft_prologue: bool = True
    attn_tiles: tuple[int, int, int] | None = None  # tree attention's (BLOCK_N, warps,
    #   stages); None: the kernel's per-head-dim constants (experiments only: lease 15)

    @property
    def fuses_prologues(self) -> bool:
        return self.kernels and self.invariant and self.fused

    @classmethod
    def for_device(cls, device: torch.device, invariant: bool = True) -> Backend:
        return cls(kernels=device.type == "cuda", invariant=invariant)


REFERENCE = Backend(kernels=False)


def linear(backend: Backend, x: Tensor, weight: Tensor, bias: Tensor | None = None,
           out_dtype: torch.dtype | None = None) -> Tensor:
    """x: (T, K); weight: (N, K) -> (T, N) in out_dtype (default x's)."""
    if backend.kernels and backend.invariant:
        return matmul.invariant_linear(x, weight, bias, out_dtype)
    out = F.linear(x, weight, bias)
    return out if out_dtype is None else out.to(out_dtype)


def rms_norm(backend: Backend, x: Tensor, weight: Tensor, eps: float,
             residual: Tensor | None = None, out: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """x, residual: (T, H) -> (normed, h) with h = x + residual (or x); `out` (T, H): where
    the normed rows go."""
    if backend.kernels:
        return rmsnorm.rms_norm(x, weight, eps, residual, out)
    normed, h = rmsnorm.rms_norm_reference(x, weight, eps, residual)
    return (normed, h) if out is None else (out.copy_(normed), h)


@dataclass(frozen=True)
class Stream:
    """The residual stream where a norm comes next: the block's output `x` that the norm
    adds to `residual` (None: x is the stream) - or, where the projection before it ran
    the norm in its reduce kernel (`join_residual`), x is the stream already summed and
    `normed` the norm's output (residual None)."""

    x: Tensor
    residual: Tensor | None = None
    normed: Tensor | None = None


class Norm(Protocol):
    """An RMSNorm's parameters (models/layers.RMSNorm)."""

    @property
    def weight(self) -> Tensor: ...

    @property
    def eps(self) -> float: ...


def norms_after(input_norms: Sequence[Norm], final_norm: Norm) -> list[tuple[Tensor, float]]:
    """The norm after each block's last projection, as `join_residual`'s `next_norm`: the
    next block's input norm, and the final norm after the last block."""
    return [(norm.weight, norm.eps) for norm in (*input_norms[1:], final_norm)]


def normalize(backend: Backend, stream: Stream, norm_weight: Tensor, eps: float,
              out: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """-> (rms_norm(h) (T, H), h), h the summed stream: computed, or taken from the reduce
    kernel that already ran this norm. `out` (T, H): where the normed rows must be (a
    copy only where the reduce kernel wrote them elsewhere)."""
    if stream.normed is not None:
        if out is None or _same_view(stream.normed, out):
            return stream.normed, stream.x
        return out.copy_(stream.normed), stream.x
    return rms_norm(backend, stream.x, norm_weight, eps, stream.residual, out)


def _same_view(a: Tensor, b: Tensor) -> bool:
    return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.dtype == b.dtype)


def norm_linear(backend: Backend, stream: Stream, norm_weight: Tensor, eps: float,
                weight: Tensor, bias: Tensor | None = None, defer: bool = False,
                joined: Tensor | None = None,
                ) -> tuple[Tensor | matmul.SplitPartials | matmul.PendingLinear, Tensor]:
    """norm_weight: (H,); weight: (N, H) -> (linear(rms_norm(h)) (T, N), h), h the summed
    residual stream (T, H): `rms_norm` then `linear`, in one GEMM when fused. With `defer`
    the QKV GEMM is left to `rope_store` to finish: a tiling that splits K leaves its
    partial sums (`Backend.reduce_fusions`, matmul.SplitPartials), one that does not is
    not run yet (`Backend.rope_epilogue`, matmul.PendingLinear: `rope_store` runs it with
    RoPE as its epilogue). `joined` (P + T, H): its first P rows need no norm and are
    projected in the same GEMM before the normed rows, which go to (or, written there by
    the projection before: `norm_swiglu_down`'s `normed_out`, are found in) its last T
    (-> (P + T, N); one read of the weight for both, no concatenation)."""
    if backend.fuses_prologues and stream.normed is None and joined is None:
        return fused_linear.norm_linear(stream.x, stream.residual, norm_weight, eps, weight,
                                        bias)
    rows = joined[joined.shape[0] - stream.x.shape[0]:] if joined is not None else None
    normed, h = normalize(backend, stream, norm_weight, eps, rows)
    if joined is not None:
        normed = joined
    if defer and backend.kernels and backend.invariant:
        if backend.reduce_fusions:
            partials = matmul.linear_partials(normed, weight, bias)
            if partials is not None:
                return partials, h
        if backend.rope_epilogue:
            return matmul.PendingLinear(normed, weight, bias), h
    return linear(backend, normed, weight, bias), h


def join_residual(backend: Backend, x: Tensor, weight: Tensor, bias: Tensor | None,
                  residual: Tensor, next_norm: tuple[Tensor, float] | None,
                  reduce: Callable[[Tensor], Tensor] | None = None,
                  normed_out: Tensor | None = None) -> Stream:
    """A projection whose output joins the residual stream (o_proj, down): x (T, K),
    weight (N, K), residual (T, N) -> the Stream for the next norm, `next_norm` = (its
    weight, eps). With `Backend.reduce_fusions` and a tiling that splits K the GEMM's reduce
    kernel adds the residual and runs that norm (fused_linear.linear_norm, same bits).
    `reduce` all-reduces a sharded projection's output before the add (no fusion).
    `normed_out`: where that fused norm writes its rows (the next `norm_linear`'s
    `joined`)."""
    if (backend.kernels and backend.invariant and backend.reduce_fusions and reduce is None
            and next_norm is not None):
        fused = fused_linear.linear_norm(x, weight, bias, residual, *next_norm,
                                         normed_out=normed_out)
        if fused is not None:
            return Stream(fused[1], None, fused[0])
    out = linear(backend, x, weight, bias)
    return Stream(reduce(out) if reduce is not None else out, residual)


def rope_store(backend: Backend, qkv: Tensor | matmul.SplitPartials | matmul.PendingLinear,
               meta: AttentionMeta, inv_freq: Tensor, k_cache: Tensor, v_cache: Tensor,
               num_heads: int, num_kv_heads: int, q_norm: Tensor | None,
               k_norm: Tensor | None, eps: float) -> Tensor:
    """qkv: (T, (Hq + 2 Hkv) D), or the QKV GEMM's split partials or the GEMM itself not
    yet run (`norm_linear`'s `defer`; kernels only) -> rotated q (T, Hq, D); k, v stored
    in the pool layer."""
    if backend.kernels:
        return rope.rope_store(qkv, meta.positions, inv_freq, k_cache, v_cache,
                               meta.write_slot, meta.write_pos, num_heads, num_kv_heads,
                               q_norm, k_norm, eps)
    assert isinstance(qkv, Tensor), "split partials and pending GEMMs come from the kernels"
    return rope.rope_store_reference(qkv, meta.positions, inv_freq, k_cache, v_cache,
                                     meta.write_slot, meta.write_pos, num_heads, num_kv_heads,
                                     q_norm, k_norm, eps)


def attention(backend: Backend, q: Tensor, k_cache: Tensor, v_cache: Tensor,
              meta: AttentionMeta, scale: float) -> Tensor:
    """q: (T, Hq, D); k_cache, v_cache: (num_slots, max_len, Hkv, D) -> (T, Hq, D)."""
    if backend.kernels:
        return tree_attention.tree_attention(
            q, k_cache, v_cache, meta.query_slot, meta.prefix_len, meta.tree_base,
            meta.tree_keys, meta.num_tree_keys, scale, meta.max_kv_len, backend.attn_tiles,
            query_group=1 if meta.queries_per_row == 1 else None)
    return tree_attention.tree_attention_reference(
        q, k_cache, v_cache, meta.query_slot, meta.prefix_len, meta.tree_base,
        meta.tree_keys, meta.num_tree_keys, scale)


def silu_mul(backend: Backend, gate_up: Tensor) -> Tensor:
    """gate_up: (T, 2I) = [gate | up] -> silu(gate) * up (T, I)."""
    if backend.kernels:
        return swiglu.silu_mul(gate_up)
    return swiglu.silu_mul_reference(gate_up)


def norm_swiglu_down(backend: Backend, stream: Stream, norm_weight: Tensor, eps: float,
                     gate_up_weight: Tensor, down_weight: Tensor,
                     next_norm: tuple[Tensor, float] | None,
                     reduce: Callable[[Tensor], Tensor] | None = None,
                     normed_out: Tensor | None = None) -> Stream:
    """The MLP of a pre-norm block -> the Stream after it: down(silu(gate) * up) of
    rms_norm(h) joined to h, the stream before it. With the invariant kernels and
    `Backend.swiglu_epilogue` the gate_up GEMM stores silu(gate) * up itself (same bits,
    one launch fewer; fused_linear.linear_swiglu); with `fused` the norm and SwiGLU are
    the GEMMs' prologues instead. `next_norm`, `normed_out`: as `join_residual`'s."""
    if backend.kernels and backend.invariant and backend.swiglu_epilogue and not backend.fused:
        config = fused_linear.swiglu_epilogue_rows_config(gate_up_weight, stream.x.shape[0])
        if config is not None:
            normed, h = normalize(backend, stream, norm_weight, eps)
            act = fused_linear.linear_swiglu(normed, gate_up_weight, config)
            return join_residual(backend, act, down_weight, None, h, next_norm, reduce,
                                 normed_out)
    gate_up, h = norm_linear(backend, stream, norm_weight, eps, gate_up_weight)
    assert isinstance(gate_up, Tensor)  # (no deferred reduce asked)
    if backend.fuses_prologues:  # the SwiGLU prologue; the next norm runs on its own
        out = swiglu_down(backend, gate_up, down_weight)
        return Stream(reduce(out) if reduce is not None else out, h)
    return join_residual(backend, silu_mul(backend, gate_up), down_weight, None, h, next_norm,
                         reduce, normed_out)


def swiglu_down(backend: Backend, gate_up: Tensor, weight: Tensor,
                bias: Tensor | None = None) -> Tensor:
    """gate_up: (T, 2I) = [gate | up]; weight: (N, I) -> linear(silu(gate) * up) (T, N):
    `silu_mul` then `linear`, in one GEMM when fused."""
    if backend.fuses_prologues:
        return fused_linear.swiglu_down(gate_up, weight, bias)
    return linear(backend, silu_mul(backend, gate_up), weight, bias)
