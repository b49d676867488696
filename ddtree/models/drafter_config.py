"""DrafterConfig: the shape and conditioning of a DFlash drafter, read from (and written
to) z-lab's `config.json`. Unsupported variants fail loudly with CheckpointError."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ddtree.errors import CheckpointError


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """z-lab's default: `num_draft_layers` target layers evenly spaced from 1 to N - 3,
    `round(1 + i*(N-4)/(k-1))` (36 layers, k=5 -> (1, 9, 17, 25, 33)).

    k == 1 has no spacing to speak of: we take the middle layer `N // 2` (z-lab's choice too),
    a layer that already mixes context but is not yet specialised to the next token.
    """
    if num_draft_layers < 1 or num_target_layers < 1:
        raise CheckpointError(
            f"cannot place {num_draft_layers} feature layers in {num_target_layers} target layers")
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    span = num_target_layers - 4
    return tuple(round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers))


@dataclass(frozen=True)
class DrafterConfig:
    """What the drafter's shapes and conditioning need; `from_hf`/`to_hf` speak z-lab's
    config.json. `has_mask_embedding` is not in that file: the loader sets it from the
    weights (a `mask_embedding` tensor present or not)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    block_size: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int | None = None
    has_mask_embedding: bool = False
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    attention_bias: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_layer_ids", tuple(int(i) for i in self.target_layer_ids))
        problems = []
        if self.block_size < 2:
            problems.append(f"block_size {self.block_size} < 2")
        if not self.target_layer_ids:
            problems.append("target_layer_ids is empty")
        if self.num_attention_heads % self.num_key_value_heads:
            problems.append(f"{self.num_attention_heads} heads not a multiple of "
                            f"{self.num_key_value_heads} KV heads")
        if self.head_dim % 2:
            problems.append(f"head_dim {self.head_dim} is odd (RoPE needs pairs)")
        if problems:
            raise CheckpointError("invalid drafter config: " + "; ".join(problems))

    @property
    def num_feature_layers(self) -> int:
        """k: how many target layers are concatenated per context token."""
        return len(self.target_layer_ids)

    @classmethod
    def from_hf(cls, d: Mapping[str, Any], has_mask_embedding: bool = False) -> DrafterConfig:
        """Parses a z-lab DFlash config.json dict; raises CheckpointError when it is not one
        or uses something we do not implement (non-default RoPE scaling, another activation)."""
        dflash = d.get("dflash_config") or {}
        block_size = _block_size(d, dflash)
        num_layers = int(_require(d, "num_hidden_layers"))
        num_target_layers = int(_require(d, "num_target_layers"))
        layer_ids = dflash.get("target_layer_ids") or d.get("target_layer_ids")
        if layer_ids is None:
            layer_ids = default_target_layer_ids(num_target_layers, num_layers)
        mask_token_id = dflash.get("mask_token_id", d.get("mask_token_id"))
        if d.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"drafter hidden_act {d['hidden_act']!r} is not supported")
        hidden = int(_require(d, "hidden_size"))
        heads = int(_require(d, "num_attention_heads"))
        return cls(
            hidden_size=hidden, num_hidden_layers=num_layers, num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or hidden // heads),
            intermediate_size=int(_require(d, "intermediate_size")),
            vocab_size=int(_require(d, "vocab_size")), block_size=block_size,
            num_target_layers=num_target_layers, target_layer_ids=tuple(layer_ids),
            mask_token_id=None if mask_token_id is None else int(mask_token_id),
            has_mask_embedding=has_mask_embedding,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)), rope_theta=_rope_theta(d),
            max_position_embeddings=int(d.get("max_position_embeddings", 40960)),
            attention_bias=bool(d.get("attention_bias", False)),
            extra={k: d[k] for k in ("bos_token_id", "eos_token_id") if k in d},
        )

    def to_hf(self) -> dict[str, Any]:
        """z-lab's config.json (Qwen3 fields + `dflash_config`); block_size both at the top
        level (older readers) and nested (newer ones)."""
        dflash: dict[str, Any] = {"block_size": self.block_size,
                                  "target_layer_ids": list(self.target_layer_ids)}
        if self.mask_token_id is not None:
            dflash["mask_token_id"] = self.mask_token_id
        n = self.num_hidden_layers
        return {
            "architectures": ["DFlashDraftModel"],
            "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
            "model_type": "qwen3", "block_size": self.block_size, "dflash_config": dflash,
            "num_target_layers": self.num_target_layers, "hidden_size": self.hidden_size,
            "num_hidden_layers": n, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size, "hidden_act": "silu",
            "vocab_size": self.vocab_size, "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta, "rope_scaling": None,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": self.attention_bias, "attention_dropout": 0.0,
            "layer_types": ["full_attention"] * n, "max_window_layers": n,
            "use_sliding_window": False, "sliding_window": None,
            "tie_word_embeddings": False, "use_cache": True, "initializer_range": 0.02,
            **dict(self.extra),
        }


def _require(d: Mapping[str, Any], key: str) -> Any:
    if d.get(key) is None:
        raise CheckpointError(f"drafter config.json has no {key!r}")
    return d[key]


def _block_size(d: Mapping[str, Any], dflash: Mapping[str, Any]) -> int:
    """Older z-lab configs have `block_size` at the top level, newer ones also nest it."""
    sizes = {int(v) for v in (d.get("block_size"), dflash.get("block_size")) if v is not None}
    if not sizes:
        raise CheckpointError("drafter config.json has no block_size: not a DFlash drafter")
    if len(sizes) > 1:
        raise CheckpointError(f"drafter config.json: block_size {d['block_size']} != "
                              f"dflash_config.block_size {dflash['block_size']}")
    return sizes.pop()


def _rope_theta(d: Mapping[str, Any]) -> float:
    """transformers 4 writes `rope_theta` (+ `rope_scaling`), 5 writes `rope_parameters`."""
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise CheckpointError(f"drafter RoPE type {rope_type!r} is not supported")
    return float(params.get("rope_theta", d.get("rope_theta", 1_000_000.0)))
