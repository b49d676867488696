"""The target model (Llama / Qwen3 / Qwen2 family) and its loaders.

One forward serves prefill, plain decoding and tree verification for a whole batch: each
new token attends to what its `AttentionMeta` entry says (its row's committed prefix in
the KV pool, then its ancestors; ddtree/models/meta.py). Its operations run as Triton
kernels on the GPU and as PyTorch references on the CPU (ddtree/models/ops.py). Module
names mirror transformers' (`layers.{i}.self_attn.q_proj`, `norm`; the embedding table and
LM head live in `embeddings`), so an HF checkpoint loads by name with a fixed `model.`
prefix mapping and nothing else."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor, nn

from ddtree.errors import CheckpointError, InvalidArgumentError
from ddtree.kernels.matmul import PendingLinear, SplitPartials
from ddtree.models import ops
from ddtree.models.checkpoint import read_config, read_tensors, require_tensors
from ddtree.models.kv_pool import KVPool
from ddtree.models.layers import RMSNorm, Rotary, SwiGLU
from ddtree.models.meta import AttentionMeta, tree_meta
from ddtree.models.ops import REFERENCE, Backend
from ddtree.models.target_config import TargetConfig

if TYPE_CHECKING:
    from ddtree.models.tensor_parallel import TensorParallel


class TargetEmbeddings(nn.Module):
    """The target's token embedding and LM head (the drafter borrows both, frozen).
    With tied embeddings `lm_head.weight` IS `embed_tokens.weight`."""

    def __init__(self, vocab_size: int, hidden_size: int, tie_word_embeddings: bool) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, hidden_size)
        self.lm_head = nn.Linear(hidden_size, vocab_size, bias=False)
        self.tie_word_embeddings = tie_word_embeddings
        self.tie()

    def tie(self) -> None:
        """Re-points the LM head at the embedding table when the config ties them."""
        if self.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def embed(self, ids: Tensor) -> Tensor:
        """ids: (B, M) int64 -> (B, M, H)."""
        return self.embed_tokens(ids)

    def logits(self, hidden: Tensor) -> Tensor:
        """hidden: (B, M, H) after the final norm -> (B, M, V) float32."""
        return self.lm_head(hidden).float()


@dataclass
class TargetOutput:
    """logits: (T', V) float32 for the rows asked for (all T by default); features:
    (T, k*H) or None when no feature layers were requested."""

    logits: Tensor
    features: Tensor | None


class Attention(nn.Module):
    """Grouped-query self-attention over the KV pool; Qwen3 adds RMSNorm over D on q and k
    before RoPE (`q_norm`, `k_norm`). q/k/v_proj keep their checkpoint names; after
    `fuse()` they are views of one fused [q | k | v] weight (one GEMM)."""

    def __init__(self, config: TargetConfig) -> None:
        super().__init__()
        hidden, head_dim = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_heads, config.num_kv_heads, head_dim)
        self.scale = 1.0 / math.sqrt(head_dim)
        self.eps = config.rms_norm_eps
        qkv_bias = config.attention_bias
        self.q_proj = nn.Linear(hidden, config.num_heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden, config.num_kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden, config.num_kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(config.num_heads * head_dim, hidden, bias=config.o_proj_bias)
        self.q_norm = RMSNorm(head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.qkv_weight: Tensor | None = None
        self.qkv_bias: Tensor | None = None

    def fuse(self) -> None:
        """One [q | k | v] weight; the three projections become views of it (no copy kept)."""
        projections = (self.q_proj, self.k_proj, self.v_proj)
        self.qkv_weight = fuse_rows([p.weight for p in projections])
        for proj, view in zip(projections, _row_views(self.qkv_weight, projections), strict=True):
            proj.weight = nn.Parameter(view, requires_grad=False)
        if self.q_proj.bias is not None:
            self.qkv_bias = torch.cat([p.bias for p in projections])  # type: ignore[misc]

    def forward(self, backend: Backend, qkv: Tensor | SplitPartials | PendingLinear,
                meta: AttentionMeta, inv_freq: Tensor, k_cache: Tensor,
                v_cache: Tensor) -> Tensor:
        """qkv: (T, (Hq+2Hkv)*D), the fused projection of the normed input (the caller's
        `ops.norm_linear` with `qkv_weight`; or that GEMM's split partials, or the GEMM
        not yet run, which `ops.rope_store` finishes) -> the attention's output (T, Hq*D), o_proj's
        input (the caller's `ops.join_residual`); stores this layer's new K/V in the pool
        layer."""
        q = ops.rope_store(
            backend, qkv, meta, inv_freq, k_cache, v_cache, self.num_heads, self.num_kv_heads,
            self.q_norm.weight if self.q_norm is not None else None,
            self.k_norm.weight if self.k_norm is not None else None, self.eps)  # (T, Hq, D)
        out = ops.attention(backend, q, k_cache, v_cache, meta, self.scale)  # (T, Hq, D)
        return out.reshape(qkv.shape[0], -1)


def fuse_rows(weights: list[Tensor]) -> Tensor:
    """Concatenates (N_i, K) weights along N, freeing nothing the caller still holds."""
    return torch.cat([w.detach() for w in weights], dim=0).contiguous()


def _row_views(fused: Tensor, projections: Sequence[nn.Linear]) -> list[Tensor]:
    sizes = [p.weight.shape[0] for p in projections]
    return list(fused.split(sizes, dim=0))


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then h + mlp(norm(h)). The residual add
    is fused into the next norm, and both into the reduce of the projection before them
    where its tiling splits K (`ops.join_residual`)."""

    def __init__(self, config: TargetConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)


def build_rotary(config: TargetConfig) -> Rotary:
    """Rotary embedding with the config's frequency scaling applied to `inv_freq`."""
    rotary = Rotary(config.head_dim, config.rope_theta)
    inv_freq = rotary.get_buffer("inv_freq")
    if config.rope_type == "linear":
        rotary.inv_freq = inv_freq / config.rope_factor
    elif config.rope_type == "llama3":
        rotary.inv_freq = llama3_inv_freq(inv_freq, config)
    return rotary


def llama3_inv_freq(inv_freq: Tensor, config: TargetConfig) -> Tensor:
    """Llama 3.1 frequency scaling (transformers' `_compute_llama3_parameters`, same float
    operations in the same order so positions rotate bit-identically): long wavelengths
    are divided by `factor`, short ones kept, the band between interpolated smoothly."""
    factor, low = config.rope_factor, config.rope_low_freq_factor
    high = config.rope_high_freq_factor
    old_context = config.rope_original_max_position
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class TargetModel(nn.Module):
    """The target LM over a KV pool. `forward` never syncs with the host and never decides
    what is committed: the caller owns the lengths and compacts the pool."""

    def __init__(self, config: TargetConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = TargetEmbeddings(config.vocab_size, config.hidden_size,
                                           config.tie_word_embeddings)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = build_rotary(config)
        self.backend = REFERENCE
        self.tp: TensorParallel | None = None  # this rank's place once sharded

    def fuse_weights(self) -> TargetModel:
        """Fused QKV and gate/up weights (call once after loading the weights)."""
        for layer in self.layers:
            cast(DecoderLayer, layer).self_attn.fuse()
            cast(DecoderLayer, layer).mlp.fuse(share=True)
        return self

    def new_pool(self, num_slots: int, max_len: int) -> KVPool:
        """An empty pool of `num_slots` rows of `max_len` slots, on the model's device and
        in its dtype."""
        weight = self.embeddings.embed_tokens.weight
        c = self.config
        if self.tp is not None:  # this rank's KV heads only
            return self.tp.new_pool(c.num_layers, num_slots, max_len,
                                    c.num_kv_heads // self.tp.world_size, c.head_dim,
                                    weight.device, weight.dtype)
        return KVPool(c.num_layers, num_slots, max_len, c.num_kv_heads, c.head_dim,
                      weight.device, weight.dtype)

    def forward(
        self,
        input_ids: Tensor,
        meta: AttentionMeta,
        pool: KVPool,
        feature_layers: Sequence[int] = (),
        logit_rows: Tensor | None = None,
    ) -> TargetOutput:
        """Runs T new tokens against the pool.

        input_ids: (T,) int64, one per entry of `meta` (which says where each token's K/V
        go and what it attends to). Logits: (T', V) float32 for `logit_rows` (T',) (all
        rows when None). Features: (T, k*H), the outputs of decoder layers
        `feature_layers` in the given order, equal to transformers' hidden_states[l + 1]
        (for the last layer that is after the final norm, as transformers returns it)."""
        self._check_feature_layers(feature_layers)
        assert input_ids.shape == (meta.num_tokens,), "one input id per meta entry"
        if self.tp is not None:
            self.tp.announce_forward(pool, input_ids, meta)  # the followers run it too
        h, captured = self.run_layers(input_ids, meta, pool, feature_layers)
        if logit_rows is not None:
            h = h.index_select(0, logit_rows)
        logits = ops.linear(self.backend, h, self.embeddings.lm_head.weight,
                            out_dtype=torch.float32)
        if not feature_layers:
            return TargetOutput(logits, None)
        return TargetOutput(logits, torch.cat([captured[i] for i in feature_layers], dim=-1))

    def run_layers(self, input_ids: Tensor, meta: AttentionMeta, pool: KVPool,
                   feature_layers: Sequence[int] = ()) -> tuple[Tensor, dict[int, Tensor]]:
        """The decoder stack: input_ids (T,) -> the final normed hidden states (T, H) and
        the outputs of `feature_layers` by index. Sharded, each row-parallel output is
        all-reduced (so every rank holds the same residual stream)."""
        backend, inv_freq = self.backend, self.rotary.inv_freq
        reduce = self.tp.all_reduce if self.tp is not None else None
        layers = [cast(DecoderLayer, module) for module in self.layers]
        after = ops.norms_after([layer.input_layernorm for layer in layers], self.norm)
        stream = ops.Stream(self.embeddings.embed(input_ids))  # (T, H)
        captured: dict[int, Tensor] = {}
        for index, layer in enumerate(layers):
            attn, mlp = layer.self_attn, layer.mlp
            assert attn.qkv_weight is not None and mlp.gate_up_weight is not None, \
                "call TargetModel.fuse_weights() after loading"
            norm = layer.input_layernorm
            qkv, residual = ops.norm_linear(backend, stream, norm.weight, norm.eps,
                                            attn.qkv_weight, attn.qkv_bias,  # (T, (Hq+2Hkv)D)
                                            defer=True)  # or its split partials / the GEMM pending
            if index - 1 in feature_layers:
                captured[index - 1] = residual  # the output of the previous layer
            out = attn(backend, qkv, meta, inv_freq, pool.k[index], pool.v[index])
            norm = layer.post_attention_layernorm
            stream = ops.join_residual(backend, out, attn.o_proj.weight, attn.o_proj.bias,
                                       residual, (norm.weight, norm.eps), reduce)
            stream = ops.norm_swiglu_down(backend, stream, norm.weight, norm.eps,
                                          mlp.gate_up_weight, mlp.down_proj.weight,
                                          after[index], reduce)
        h, _ = ops.normalize(backend, stream, self.norm.weight, self.norm.eps)
        last_layer = self.config.num_layers - 1
        if last_layer in feature_layers:
            captured[last_layer] = h  # transformers reports the last layer normed
        return h, captured

    def causal(self, input_ids: Tensor, feature_layers: Sequence[int] = ()) -> TargetOutput:
        """A plain causal pass over whole sequences in a fresh pool (no committed prefix):
        input_ids (B, M) -> logits (B, M, V) float32, features (B, M, k*H) or None."""
        batch, length = input_ids.shape
        pool = self.new_pool(batch, length)
        slots = torch.arange(batch, device=input_ids.device)
        parents = torch.arange(-1, length - 1, device=input_ids.device).expand(batch, length)
        depth = torch.arange(length, device=input_ids.device).expand(batch, length)
        zero = torch.zeros(batch, dtype=torch.long, device=input_ids.device)
        meta = tree_meta(slots, zero, parents, depth, length, length)  # a chain is causal
        out = self.forward(input_ids.reshape(-1), meta, pool, feature_layers)
        features = out.features.view(batch, length, -1) if out.features is not None else None
        return TargetOutput(out.logits.view(batch, length, -1), features)

    def _check_feature_layers(self, feature_layers: Sequence[int]) -> None:
        for index in feature_layers:
            if not 0 <= index < self.config.num_layers:
                raise InvalidArgumentError(
                    f"feature layer {index} outside [0, {self.config.num_layers})")


def _hf_name(name: str) -> str:
    """Our parameter name -> the checkpoint's (transformers') name."""
    if name.startswith("embeddings.lm_head."):
        return name.removeprefix("embeddings.")
    return "model." + name.removeprefix("embeddings.")


def _is_ignored(hf_name: str, config: TargetConfig) -> bool:
    """Checkpoint tensors we neither need nor require: RoPE tables that old transformers
    versions saved, and a redundant `lm_head.weight` next to tied embeddings."""
    if hf_name.endswith("rotary_emb.inv_freq"):
        return True
    return config.tie_word_embeddings and hf_name == "lm_head.weight"


def _assign_weights(module: nn.Module, prefix: str, tensors: dict[str, Tensor], path: Path,
                    tied: bool) -> None:
    """Strictly loads `tensors` (HF names) into `module`, whose parameter names map to HF
    names through `_hf_name(prefix + name)`; the loaded tensors become the parameters.
    With `tied`, `lm_head.weight` is not read (the caller re-ties it)."""
    names = {n: _hf_name(prefix + n) for n in module.state_dict(keep_vars=True)}
    if tied:
        names = {n: hf for n, hf in names.items() if hf != "lm_head.weight"}
    require_tensors(tensors, names.values(), path)
    unexpected = sorted(tensors.keys() - set(names.values()))
    if unexpected:
        raise CheckpointError(f"checkpoint {path} has unexpected tensor(s): "
                              f"{', '.join(unexpected[:8])}")
    state = {}
    for name, hf in names.items():
        expected = module.get_parameter(name).shape
        if tensors[hf].shape != expected:
            raise CheckpointError(f"tensor {hf} in {path} has shape {tuple(tensors[hf].shape)}; "
                                  f"the config implies {tuple(expected)}")
        state[name] = tensors[hf]
    module.load_state_dict(state, strict=False, assign=True)


def load_target(path: Path | str, device: torch.device | str, dtype: torch.dtype) -> TargetModel:
    """The target in checkpoint directory `path` (HF config.json + safetensors), weights in
    `dtype` on `device`, in eval mode with gradients off (the target is always frozen)."""
    path = Path(path)
    config = TargetConfig.from_hf(read_config(path))
    tensors = read_tensors(path, device, dtype, select=lambda n: not _is_ignored(n, config))
    # Built on the meta device: no memory or random init for weights about to be replaced.
    with torch.device("meta"):
        model = TargetModel(config)
    _assign_weights(model, "", tensors, path, config.tie_word_embeddings)
    model.embeddings.tie()
    model.rotary = build_rotary(config).to(device)  # inv_freq stays float32
    model.backend = Backend.for_device(torch.device(device))
    return model.eval().requires_grad_(False).fuse_weights()


def load_target_embeddings(path: Path | str, device: torch.device | str,
                           dtype: torch.dtype) -> TargetEmbeddings:
    """Only the embedding table and LM head of the target in `path` (what the drafter
    service needs); no other tensor is read."""
    path = Path(path)
    config = TargetConfig.from_hf(read_config(path))
    wanted = {"model.embed_tokens.weight", "lm_head.weight"}
    tensors = read_tensors(path, device, dtype,
                           select=lambda n: n in wanted and not _is_ignored(n, config))
    with torch.device("meta"):
        embeddings = TargetEmbeddings(config.vocab_size, config.hidden_size,
                                      config.tie_word_embeddings)
    _assign_weights(embeddings, "embeddings.", tensors, path, config.tie_word_embeddings)
    embeddings.tie()
    return embeddings.eval().requires_grad_(False)
