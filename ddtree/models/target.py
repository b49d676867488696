"""The target model (Llama / Qwen3 / Qwen2 family) in plain PyTorch, and its loaders.

One forward serves prefill, plain decoding and tree verification: the M new tokens attend
to the committed cache slots of their batch row plus the new slots their `tree_mask` row
allows (causal when None). Module names mirror transformers' (`layers.{i}.self_attn.q_proj`,
`norm`; the embedding table and LM head live in `embeddings`), so an HF checkpoint loads by
name with a fixed `model.` prefix mapping and nothing else."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ddtree.errors import CheckpointError, InvalidArgumentError
from ddtree.models.checkpoint import read_config, read_tensors, require_tensors
from ddtree.models.kv_cache import KVCache
from ddtree.models.layers import RMSNorm, Rotary, SwiGLU, apply_rope, attend
from ddtree.models.target_config import TargetConfig


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
    """logits: (B, M, V) float32, or (B, 1, V) with `last_only`; features: (B, M, k*H)
    or None when no feature layers were requested."""

    logits: Tensor
    features: Tensor | None


@dataclass
class _Step:
    """What every layer of one forward shares."""

    cos: Tensor  # (B, 1, M, D)
    sin: Tensor  # (B, 1, M, D)
    offsets: Tensor  # (B, M) cache slot of each new token
    kv_len: int
    visible: Tensor  # (B, M, kv_len) bool


class Attention(nn.Module):
    """Grouped-query self-attention over the cache; Qwen3 adds RMSNorm over D on q and k
    before RoPE (`q_norm`, `k_norm`)."""

    def __init__(self, config: TargetConfig) -> None:
        super().__init__()
        hidden, head_dim = config.hidden_size, config.head_dim
        self.head_dim = head_dim
        self.scale = 1.0 / math.sqrt(head_dim)
        qkv_bias = config.attention_bias
        self.q_proj = nn.Linear(hidden, config.num_heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden, config.num_kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden, config.num_kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(config.num_heads * head_dim, hidden, bias=config.o_proj_bias)
        self.q_norm = RMSNorm(head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(head_dim, config.rms_norm_eps) if config.qk_norm else None

    def forward(self, x: Tensor, step: _Step, cache: KVCache, layer: int) -> Tensor:
        """x: (B, M, H) -> (B, M, H); writes this layer's new K/V into `cache`."""
        batch, num_new, _ = x.shape
        q = self.q_proj(x).view(batch, num_new, -1, self.head_dim)  # (B, M, Hq, D)
        k = self.k_proj(x).view(batch, num_new, -1, self.head_dim)  # (B, M, Hkv, D)
        v = self.v_proj(x).view(batch, num_new, -1, self.head_dim)  # (B, M, Hkv, D)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q.transpose(1, 2), step.cos, step.sin)  # (B, Hq, M, D)
        k = apply_rope(k.transpose(1, 2), step.cos, step.sin)  # (B, Hkv, M, D)
        cache.write(layer, step.offsets, k, v.transpose(1, 2))
        keys = cache.k[layer, :, :, :step.kv_len]  # (B, Hkv, S, D)
        values = cache.v[layer, :, :, :step.kv_len]  # (B, Hkv, S, D)
        out = attend(q, keys, values, step.visible, self.scale)  # (B, Hq, M, D)
        return self.o_proj(out.transpose(1, 2).reshape(batch, num_new, -1))  # (B, M, Hq*D)


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then h + mlp(norm(h))."""

    def __init__(self, config: TargetConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)

    def forward(self, x: Tensor, step: _Step, cache: KVCache, layer: int) -> Tensor:
        h = x + self.self_attn(self.input_layernorm(x), step, cache, layer)
        return h + self.mlp(self.post_attention_layernorm(h))


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


def visible_slots(cache_lens: Tensor, kv_len: int, new_mask: Tensor) -> Tensor:
    """Which key slots each new token sees; no host sync.

    cache_lens: (B,) int64 committed length per row; new_mask: (B, M, M) bool, query m may
    see new token j. Returns (B, M, kv_len) bool: slot s is visible to query m of row b iff
    s < cache_lens[b], or s == cache_lens[b] + j with new_mask[b, m, j]."""
    batch, num_new, _ = new_mask.shape
    slots = torch.arange(kv_len, device=cache_lens.device)
    rel = slots[None, :] - cache_lens[:, None]  # (B, S) slot index among the new tokens
    is_new = (rel >= 0) & (rel < num_new)  # (B, S)
    index = rel.clamp(0, num_new - 1)[:, None, :].expand(batch, num_new, kv_len)  # (B, M, S)
    sees_new = new_mask.gather(2, index) & is_new[:, None, :]  # (B, M, S)
    return (rel < 0)[:, None, :] | sees_new


class TargetModel(nn.Module):
    """The target LM. `forward` never syncs with the host and never changes `cache_lens`:
    the caller decides which of the new rows to commit (see KVCache.compact)."""

    def __init__(self, config: TargetConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = TargetEmbeddings(config.vocab_size, config.hidden_size,
                                           config.tie_word_embeddings)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = build_rotary(config)

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        """An empty cache for `batch` rows of up to `max_len` slots, on the model's device
        and in its dtype."""
        weight = self.embeddings.embed_tokens.weight
        c = self.config
        return KVCache(c.num_layers, batch, c.num_kv_heads, max_len, c.head_dim,
                       weight.device, weight.dtype)

    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        cache: KVCache,
        cache_lens: Tensor,
        kv_len: int,
        tree_mask: Tensor | None = None,
        feature_layers: Sequence[int] = (),
        last_only: bool = False,
    ) -> TargetOutput:
        """Runs M new tokens per row against the cache.

        input_ids, positions: (B, M) int64; cache_lens: (B,) int64; tree_mask: (B, M, M)
        bool, query m sees new token j iff tree_mask[b, m, j] (None = causal). Writes the
        new K/V at slots `cache_lens[b] + j`; keys are read from slots [0, kv_len), so
        `kv_len >= max(cache_lens) + M`. Logits: (B, M, V) float32 ((B, 1, V) for the last
        row with `last_only`). Features: (B, M, k*H), the outputs of decoder layers
        `feature_layers` in the given order, equal to transformers' hidden_states[l + 1]
        (for the last layer that is after the final norm, as transformers returns it)."""
        self._check_feature_layers(feature_layers)
        batch, num_new = input_ids.shape
        if tree_mask is None:
            causal = torch.ones(num_new, num_new, dtype=torch.bool, device=input_ids.device)
            tree_mask = causal.tril().expand(batch, num_new, num_new)  # (B, M, M)
        h = self.embeddings.embed(input_ids)  # (B, M, H)
        cos, sin = self.rotary.cos_sin(positions, h.dtype)
        offsets = cache_lens[:, None] + torch.arange(num_new, device=input_ids.device)  # (B, M)
        step = _Step(cos, sin, offsets, kv_len, visible_slots(cache_lens, kv_len, tree_mask))
        captured: dict[int, Tensor] = {}
        for index, layer in enumerate(self.layers):
            h = layer(h, step, cache, index)
            if index in feature_layers:
                captured[index] = h
        return self._head(h, captured, feature_layers, last_only)

    def _head(self, h: Tensor, captured: dict[int, Tensor], feature_layers: Sequence[int],
              last_only: bool) -> TargetOutput:
        """Final norm + LM head on the last layer's output h (B, M, H), and the features."""
        last_layer = self.config.num_layers - 1
        if last_only and last_layer not in captured:
            h = self.norm(h[:, -1:])  # (B, 1, H): prefill needs only the next token
        else:
            h = self.norm(h)
            if last_layer in captured:
                captured[last_layer] = h  # transformers reports the last layer normed
        logits = self.embeddings.logits(h[:, -1:] if last_only else h)
        if not feature_layers:
            return TargetOutput(logits, None)
        return TargetOutput(logits, torch.cat([captured[i] for i in feature_layers], dim=-1))

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
    return model.eval().requires_grad_(False)


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
