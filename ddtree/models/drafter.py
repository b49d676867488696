"""The DFlash drafter (ALGORITHMS.md section 2): a few Qwen3 decoder layers that fill a whole
block `[bonus, MASK x (b-1)]` in one forward, conditioned on fused target features through
extra keys/values ("KV injection"). It has no embedding table or LM head: it borrows the
target's (`TargetEmbeddings`).

Two paths share the layers:
- inference (`append_context` + `draft`, a whole batch of pool rows at once): each layer's
  context K/V depend only on the fused context vector, so they are computed once when a
  token is committed and kept in the drafter's KV pool (append-only per row); the block's
  own K/V are written past the context as scratch every round and never committed.
- training (`forward_blocks`): context K/V recomputed from the fused features, many blocks
  per sequence, visibility given by the caller's block mask.

Checkpoints use z-lab's format (config.json with `dflash_config`, weight names without a
`model.` prefix); `load_drafter` reads them without executing their remote code.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch
from torch import Tensor, nn

from ddtree.errors import CheckpointError, IncompatibleModelsError
from ddtree.kernels.matmul import PendingLinear, SplitPartials
from ddtree.models import ops
from ddtree.models.checkpoint import (
    MAX_SHARD_BYTES,
    read_config,
    read_tensors,
    require_tensors,
    write_tensors,
)
from ddtree.models.drafter_config import DrafterConfig
from ddtree.models.kv_pool import KVPool
from ddtree.models.layers import RMSNorm, Rotary, SwiGLU, apply_rope, attend
from ddtree.models.meta import AttentionMeta, block_meta, context_meta, stored_rows
from ddtree.models.ops import REFERENCE, Backend
from ddtree.models.target import TargetEmbeddings, fuse_rows
from ddtree.models.target_config import TargetConfig

MASK_EMBEDDING = "mask_embedding"
WEIGHTS_FILE = "model.safetensors"


class DraftAttention(nn.Module):
    """Qwen3 attention whose keys/values are [context ; block] and whose queries are the
    block's; context and block K/V come from the same projections (`project_kv`)."""

    def __init__(self, c: DrafterConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            c.num_attention_heads, c.num_key_value_heads, c.head_dim)
        bias = c.attention_bias
        self.q_proj = nn.Linear(c.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(c.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(c.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, c.hidden_size, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, c.rms_norm_eps)
        self.qkv_weight: Tensor | None = None
        self.qkv_bias: Tensor | None = None

    def _split(self, x: Tensor, num_heads: int) -> Tensor:
        b, m, _ = x.shape
        return x.view(b, m, num_heads, self.head_dim)  # (B, M, heads, D)

    def project_kv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """x: (B, M, H); cos, sin: (B, 1, M, D) -> k (after k_norm, RoPE), v: (B, Hkv, M, D)."""
        k = self.k_norm(self._split(self.k_proj(x), self.num_kv_heads)).transpose(1, 2)
        v = self._split(self.v_proj(x), self.num_kv_heads).transpose(1, 2)  # (B, Hkv, M, D)
        return apply_rope(k, cos, sin), v

    def fuse(self) -> None:
        """One [q | k | v] weight for inference (the projections stay as they are)."""
        self.qkv_weight = fuse_rows([self.q_proj.weight, self.k_proj.weight,
                                     self.v_proj.weight])
        self.qkv_bias = (torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
                         if self.q_proj.bias is not None else None)

    def forward_pool(self, backend: Backend, qkv: Tensor | SplitPartials | PendingLinear,
                     meta: AttentionMeta, inv_freq: Tensor, k_cache: Tensor,
                     v_cache: Tensor, stored: AttentionMeta | None = None,
                     num_context: int = 0) -> Tensor:
        """Inference: qkv (T, (Hq+2Hkv)*D), the fused projection of the normed block rows
        (`ops.norm_linear` with `qkv_weight`) -> the attention's output (T, Hq*D), o_proj's
        input (`ops.join_residual`); the block's K/V are written past each row's context
        (scratch) and attended together with the context. With `num_context` qkv's first
        rows are new context rows (`draft`'s `context`) and `stored` says where all of
        qkv's rows go; their K/V are stored before the block attends."""
        q = ops.rope_store(backend, qkv, stored or meta, inv_freq, k_cache, v_cache,
                           self.num_heads, self.num_kv_heads, self.q_norm.weight,
                           self.k_norm.weight, self.q_norm.eps)[num_context:]  # (T, Hq, D)
        out = ops.attention(backend, q, k_cache, v_cache, meta, self.head_dim ** -0.5)
        return out.reshape(q.shape[0], -1)

    def forward(self, h: Tensor, ctx_k: Tensor, ctx_v: Tensor, cos: Tensor, sin: Tensor,
                visible: Tensor) -> Tensor:
        """h: (B, Q, H) normed block; ctx_k, ctx_v: (B, Hkv, S, D); cos, sin: (B, 1, Q, D);
        visible: (B, Q, S + Q) bool -> (B, Q, H)."""
        b, q_len, _ = h.shape
        q = self.q_norm(self._split(self.q_proj(h), self.num_heads)).transpose(1, 2)
        q = apply_rope(q, cos, sin)  # (B, Hq, Q, D)
        k, v = self.project_kv(h, cos, sin)
        k = torch.cat([ctx_k, k], dim=2)  # (B, Hkv, S + Q, D)
        v = torch.cat([ctx_v, v], dim=2)
        out = attend(q, k, v, visible, self.head_dim ** -0.5)  # (B, Hq, Q, D)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, self.num_heads * self.head_dim))


class DraftLayer(nn.Module):
    """A Qwen3 decoder layer; the context K/V enter attention un-normed by input_layernorm
    (they were normed once by `hidden_norm` in `fuse`)."""

    def __init__(self, c: DrafterConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = DraftAttention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = SwiGLU(c.hidden_size, c.intermediate_size)

    def forward(self, x: Tensor, ctx_k: Tensor, ctx_v: Tensor, cos: Tensor, sin: Tensor,
                visible: Tensor) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), ctx_k, ctx_v, cos, sin, visible)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """The DFlash draft model; parameter names are z-lab's (`layers.{i}...`, `fc`,
    `hidden_norm`, `norm`, optional `mask_embedding`), so `state_dict()` is the checkpoint."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.layers = nn.ModuleList(DraftLayer(c) for _ in range(c.num_hidden_layers))
        self.fc = nn.Linear(c.num_feature_layers * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.rotary = Rotary(c.head_dim, c.rope_theta)
        if c.has_mask_embedding:
            self.mask_embedding = nn.Parameter(torch.zeros(c.hidden_size))
        else:
            self.register_parameter(MASK_EMBEDDING, None)

    def fuse(self, features: Tensor) -> Tensor:
        """features: (B, C, k*H) concatenated target layer outputs -> (B, C, H) context."""
        return self.hidden_norm(self.fc(features))

    def fuse_infer(self, features: Tensor, backend: ops.Backend,
                   out: Tensor | None = None) -> Tensor:
        """`fuse` through the backend (inference): the batch-invariant GEMM and the RMSNorm
        kernel on the GPU (two launches, where `fc` through cuBLAS and the norm's eight
        PyTorch operations were nine, and whose bits followed the batch), the same
        operations as `fuse` on the references. `out` (rows, H): where the result goes."""
        rows = features.reshape(-1, features.shape[-1]).to(self.fc.weight.dtype).contiguous()
        h = ops.linear(backend, rows, self.fc.weight)
        normed, _ = ops.rms_norm(backend, h, self.hidden_norm.weight, self.hidden_norm.eps,
                                 out=out)
        return normed.view(*features.shape[:-1], -1)

    def new_pool(self, num_slots: int, max_len: int) -> KVPool:
        """An empty draft KV pool (context K/V only) of `num_slots` rows of `max_len`."""
        c, w = self.config, self.fc.weight
        return KVPool(c.num_hidden_layers, num_slots, max_len, c.num_key_value_heads,
                      c.head_dim, w.device, w.dtype)

    def fuse_weights(self) -> DFlashDrafter:
        """Fused QKV and gate/up weights for inference, copied from the modules (training
        uses the modules; call again after changing their weights)."""
        for layer in self.layers:
            draft_layer = cast(DraftLayer, layer)
            draft_layer.self_attn.fuse()
            draft_layer.mlp.fuse(share=False)
        return self

    def append_context(self, pool: KVPool, slots: Tensor, start: Tensor, fused: Tensor,
                       backend: Backend = REFERENCE) -> None:
        """Writes every layer's context K (k_norm, RoPE) and V of `fused` (B, C, H) at
        slots start[b] + j of rows `slots` (B,); start: (B,) int64, also the position of
        the first row. No host sync; the caller advances its lengths by the rows it
        means to keep (rows past them are overwritten by the next block).

        Each layer is the attention prologue alone: the fused QKV projection and the
        RoPE + store kernel (its q is not needed; computing it costs less than a launch)."""
        batch, num_new, hidden = fused.shape
        self.store_context(pool, context_meta(slots, start, num_new),
                           fused.reshape(batch * num_new, hidden), backend)

    def store_context(self, pool: KVPool, meta: AttentionMeta, x: Tensor,
                      backend: Backend = REFERENCE) -> None:
        """`append_context` at the rows and positions `meta` names (write_slot, write_pos,
        positions) for the fused context rows x (T, H)."""
        for i, module in enumerate(self.layers):
            attn = cast(DraftLayer, module).self_attn
            assert attn.qkv_weight is not None, "call DFlashDrafter.fuse_weights() first"
            qkv = ops.linear(backend, x, attn.qkv_weight, attn.qkv_bias)
            ops.rope_store(backend, qkv, meta, self.rotary.inv_freq, pool.k[i], pool.v[i],
                           attn.num_heads, attn.num_kv_heads, attn.q_norm.weight,
                           attn.k_norm.weight, attn.q_norm.eps)

    def draft(self, pool: KVPool, slots: Tensor, context_len: Tensor, bonus: Tensor,
              embeddings: TargetEmbeddings, backend: Backend = REFERENCE,
              context: tuple[Tensor, AttentionMeta] | None = None) -> Tensor:
        """One block per row, no host sync. slots: (B,) pool rows; context_len: (B,) their
        committed context (the block starts at that position); bonus: (B,) -> (B, L, V)
        float32 logits of block positions 1..b-1. `context`: new context rows (C, H)
        (`fuse_infer`'s) and where they go (`context_meta`, none of them at the block's
        positions), stored here as `append_context` would, each layer's K/V projected in
        the block's QKV GEMM (one read of its weight a layer instead of two)."""
        block_size = self.config.block_size
        meta = block_meta(slots, context_len, block_size, pool.max_len)
        x = self.block_embeddings(bonus[:, None], embeddings, block_size)  # (B, b, H)
        x = x.reshape(slots.shape[0] * block_size, -1)  # (T, H)
        if context is None:
            return self.draft_block(pool, x, meta, embeddings, backend)
        joined = torch.cat([context[0], torch.empty_like(x)])  # (C + T, H)
        return self.draft_block(pool, x, meta, embeddings, backend, joined,
                                stored_rows(context[1], meta))

    def draft_block(self, pool: KVPool, x: Tensor, meta: AttentionMeta,
                    embeddings: TargetEmbeddings, backend: Backend,
                    joined: Tensor | None = None, stored: AttentionMeta | None = None
                    ) -> Tensor:
        """`draft`'s layers over its inputs: x (T, H) the blocks' embeddings (T = B * b),
        meta their queries (`block_meta`). `joined` (C + T, H): its first C rows new
        context rows (`fuse_infer`'s), projected in the blocks' QKV GEMMs before the
        blocks' normed rows, which every layer's norm writes into its last T rows (no
        concatenation a layer); `stored`: where all C + T rows' K/V go. -> (B, L, V)
        float32."""
        block_size = self.config.block_size
        batch = x.shape[0] // block_size
        num_context = joined.shape[0] - x.shape[0] if joined is not None else 0
        normed_rows = joined[num_context:] if joined is not None else None
        stream = ops.Stream(x)
        inv_freq = self.rotary.inv_freq
        layers = [cast(DraftLayer, module) for module in self.layers]
        after = ops.norms_after([layer.input_layernorm for layer in layers], self.norm)
        for i, layer in enumerate(layers):
            attn, mlp = layer.self_attn, layer.mlp
            assert attn.qkv_weight is not None and mlp.gate_up_weight is not None, \
                "call DFlashDrafter.fuse_weights() first"
            norm = layer.input_layernorm
            qkv, residual = ops.norm_linear(backend, stream, norm.weight, norm.eps,
                                            attn.qkv_weight, attn.qkv_bias, defer=True,
                                            joined=joined)
            out = attn.forward_pool(backend, qkv, meta, inv_freq, pool.k[i], pool.v[i],
                                    stored, num_context)
            norm = layer.post_attention_layernorm
            stream = ops.join_residual(backend, out, attn.o_proj.weight, attn.o_proj.bias,
                                       residual, (norm.weight, norm.eps))
            stream = ops.norm_swiglu_down(  # the next layer's normed rows into `joined`
                backend, stream, norm.weight, norm.eps, mlp.gate_up_weight,
                mlp.down_proj.weight, after[i],
                normed_out=normed_rows if i + 1 < len(layers) else None)
        h, _ = ops.normalize(backend, stream, self.norm.weight, self.norm.eps)
        h = h.view(batch, block_size, -1)[:, 1:].reshape(batch * (block_size - 1), -1)
        logits = ops.linear(backend, h, embeddings.lm_head.weight, out_dtype=torch.float32)
        return logits.view(batch, block_size - 1, -1)

    def mask_row(self, embeddings: TargetEmbeddings) -> Tensor:
        """(H,) in the embeddings' dtype: the input of every block position past the
        first (`mask_embedding` when present, else the embedding of `mask_token_id`: a
        view of the table's row)."""
        weight = embeddings.embed_tokens.weight
        if self.mask_embedding is not None:
            return self.mask_embedding.to(weight.dtype)
        assert self.config.mask_token_id is not None, "drafter has no mask token"
        return weight[self.config.mask_token_id]

    def block_embeddings(self, bonus: Tensor, embeddings: TargetEmbeddings,
                         block_size: int) -> Tensor:
        """bonus: (B, n) first token of each block -> (B, n*b, H): per block the target's
        embedding of the bonus token, then b-1 mask rows (`mask_embedding` when present,
        else the target's embedding of `mask_token_id`)."""
        batch, n = bonus.shape
        first = embeddings.embed(bonus)  # (B, n, H)
        mask = self.mask_row(embeddings)  # (H,)
        rest = mask.expand(batch, n, block_size - 1, mask.shape[-1])  # (B, n, b-1, H)
        block = torch.cat([first[:, :, None], rest], dim=2)  # (B, n, b, H)
        return block.reshape(batch, n * block_size, -1)

    def _run_layers(self, x: Tensor, context_kv: Callable[[int], tuple[Tensor, Tensor]],
                    cos: Tensor, sin: Tensor, visible: Tensor) -> Tensor:
        """x: (B, Q, H) block states; context_kv(i) -> layer i's (ctx_k, ctx_v)."""
        for i, layer in enumerate(self.layers):
            ctx_k, ctx_v = context_kv(i)
            x = layer(x, ctx_k, ctx_v, cos, sin, visible)
        return self.norm(x)

    def forward_blocks(self, fused_ctx: Tensor, ctx_positions: Tensor, block_embeds: Tensor,
                       block_positions: Tensor, visible: Tensor) -> Tensor:
        """The training path. fused_ctx: (B, S, H) from `fuse`; ctx_positions: (B, S);
        block_embeds: (B, Q, H) (e.g. `block_embeddings`); block_positions: (B, Q);
        visible: (B, Q, S + Q) bool over [context ; blocks] keys -> (B, Q, H) after `norm`."""
        ctx_cos, ctx_sin = self.rotary.cos_sin(ctx_positions, fused_ctx.dtype)
        cos, sin = self.rotary.cos_sin(block_positions, block_embeds.dtype)
        return self._run_layers(
            block_embeds,
            lambda i: cast(DraftLayer, self.layers[i]).self_attn.project_kv(
                fused_ctx, ctx_cos, ctx_sin),
            cos, sin, visible)


def check_compatible(config: DrafterConfig, target: TargetConfig) -> None:
    """IncompatibleModelsError listing every way the drafter does not fit the target."""
    problems = []
    if config.hidden_size != target.hidden_size:
        problems.append(f"hidden_size {config.hidden_size} != target's {target.hidden_size}")
    if config.vocab_size != target.vocab_size:
        problems.append(f"vocab_size {config.vocab_size} != target's {target.vocab_size}")
    if config.num_target_layers != target.num_layers:
        problems.append(f"trained on a {config.num_target_layers}-layer target; this target "
                        f"has {target.num_layers} layers")
    outside = [i for i in config.target_layer_ids if not 0 <= i < target.num_layers]
    if outside:
        problems.append(f"target_layer_ids {outside} outside the target's layers "
                        f"[0, {target.num_layers})")
    # With a learned `mask_embedding`, mask_token_id (if any) is never embedded: skip it.
    mask_id = config.mask_token_id
    if not config.has_mask_embedding:
        if mask_id is None:
            problems.append("no dflash_config.mask_token_id and no mask_embedding tensor")
        elif not 0 <= mask_id < target.vocab_size:
            problems.append(f"mask_token_id {mask_id} outside the target's vocabulary "
                            f"[0, {target.vocab_size})")
    if problems:
        raise IncompatibleModelsError("drafter does not fit the target: " + "; ".join(problems))


def load_drafter(path: Path | str, target_config: TargetConfig, device: torch.device | str,
                 dtype: torch.dtype) -> DFlashDrafter:
    """The z-lab-format drafter in `path`, checked against `target_config`, weights in
    `dtype` on `device`, in eval mode. CheckpointError for missing/corrupt files or
    tensors that do not match the config; IncompatibleModelsError when the pair does not fit."""
    path = Path(path)
    raw = read_config(path)
    tensors = read_tensors(path, device, dtype,
                           select=lambda n: not n.endswith("rotary_emb.inv_freq"))
    config = DrafterConfig.from_hf(raw, has_mask_embedding=MASK_EMBEDDING in tensors)
    check_compatible(config, target_config)
    # Built on the meta device: no memory or random init for weights about to be replaced.
    with torch.device("meta"):
        drafter = DFlashDrafter(config)
    expected = drafter.state_dict()
    require_tensors(tensors, expected.keys(), path)
    unexpected = sorted(tensors.keys() - expected.keys())
    if unexpected:
        raise CheckpointError(f"drafter checkpoint {path} has unexpected tensor(s): "
                              f"{', '.join(unexpected[:8])}")
    for name, tensor in tensors.items():
        if tensor.shape != expected[name].shape:
            raise CheckpointError(f"tensor {name} in {path} has shape {tuple(tensor.shape)}; "
                                  f"the config implies {tuple(expected[name].shape)}")
    drafter.load_state_dict(tensors, strict=True, assign=True)
    drafter.rotary = Rotary(config.head_dim, config.rope_theta).to(device)  # float32 inv_freq
    return drafter.eval().fuse_weights()


def save_drafter(drafter: DFlashDrafter, path: Path | str,
                 max_shard_bytes: int = MAX_SHARD_BYTES) -> list[Path]:
    """Writes `path/config.json` and the weights in z-lab's format (in the drafter's dtype;
    `mask_embedding` only when the drafter has one): one `model.safetensors`, or shards of
    at most `max_shard_bytes` plus `model.safetensors.index.json` when larger. Returns the
    files written."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = drafter.config.to_hf()
    config["torch_dtype"] = str(drafter.fc.weight.dtype).removeprefix("torch.")
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    state = {name: t.detach().to("cpu").contiguous() for name, t in drafter.state_dict().items()}
    return [path / "config.json", *write_tensors(state, path, max_shard_bytes)]
