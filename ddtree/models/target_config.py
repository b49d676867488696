"""TargetConfig: the architecture of a Llama / Qwen3 (and Qwen2) target, read from an HF
`config.json` dict. Everything the target model needs is here, validated once, so the
model code never looks at the raw dict. Unsupported variants fail loudly with
CheckpointError instead of silently computing something else."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ddtree.errors import CheckpointError

Family = Literal["llama", "qwen3", "qwen2"]

# model_type -> (family, the `architectures` entry transformers writes for it)
SUPPORTED_MODEL_TYPES: dict[str, tuple[Family, str]] = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class TargetConfig:
    """Architecture of a target model. `attention_bias` is the bias of q/k/v_proj,
    `o_proj_bias` that of o_proj (both equal `attention_bias` in Llama/Qwen3 configs; Qwen2
    has q/k/v bias only). RoPE scaling: `rope_type` "default" ignores the `rope_*` scaling
    fields; "linear" divides frequencies by `rope_factor`; "llama3" is Llama 3.1's scheme."""

    family: Family
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    qk_norm: bool = False
    attention_bias: bool = False
    o_proj_bias: bool = False
    max_position_embeddings: int = 2048
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position: int = 8192

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(
                f"num_attention_heads {self.num_heads} is not a multiple of "
                f"num_key_value_heads {self.num_kv_heads}")
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise CheckpointError(f"unsupported rope_type {self.rope_type!r}; supported: "
                                  f"{', '.join(SUPPORTED_ROPE_TYPES)}")

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> TargetConfig:
        """Reads an HF config dict (transformers 4.x or 5.x layout)."""
        model_type = d.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise CheckpointError(f"unsupported model_type {model_type!r}; supported: "
                                  f"{', '.join(SUPPORTED_MODEL_TYPES)}")
        family, architecture = SUPPORTED_MODEL_TYPES[model_type]
        architectures = d.get("architectures") or [architecture]
        if architecture not in architectures:
            raise CheckpointError(f"unsupported architectures {architectures} for model_type "
                                  f"{model_type!r}; expected {architecture}")
        _check_plain_variant(d)
        num_heads = _required(d, "num_attention_heads")
        hidden_size = _required(d, "hidden_size")
        bias = bool(d.get("attention_bias", False))
        return cls(
            family=family,
            vocab_size=_required(d, "vocab_size"),
            hidden_size=hidden_size,
            intermediate_size=_required(d, "intermediate_size"),
            num_layers=_required(d, "num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=int(d.get("num_key_value_heads") or num_heads),
            head_dim=int(d.get("head_dim") or hidden_size // num_heads),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            qk_norm=family == "qwen3",
            # Qwen2 hard-codes bias on q/k/v and none on o_proj.
            attention_bias=True if family == "qwen2" else bias,
            o_proj_bias=False if family == "qwen2" else bias,
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            eos_token_ids=_token_ids(d.get("eos_token_id")),
            bos_token_id=d.get("bos_token_id"),
            **_rope_fields(d),
        )


def _required(d: dict[str, Any], key: str) -> int:
    if key not in d or d[key] is None:
        raise CheckpointError(f"config.json lacks the required field {key!r}")
    return int(d[key])


def _token_ids(value: int | list[int] | None) -> tuple[int, ...]:
    """`eos_token_id` may be absent, one id or a list of ids."""
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _check_plain_variant(d: dict[str, Any]) -> None:
    """Rejects config switches that change the computation and that we do not implement."""
    if d.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"unsupported hidden_act {d['hidden_act']!r} (only silu)")
    if d.get("mlp_bias"):
        raise CheckpointError("unsupported mlp_bias=true")
    layer_types = d.get("layer_types") or []
    if d.get("use_sliding_window") or any(t != "full_attention" for t in layer_types):
        raise CheckpointError("unsupported sliding-window attention layers")
    if float(d.get("partial_rotary_factor", 1.0)) != 1.0:
        raise CheckpointError("unsupported partial_rotary_factor != 1")


def _rope_fields(d: dict[str, Any]) -> dict[str, Any]:
    """RoPE settings from transformers 5's `rope_parameters` or 4.x's `rope_theta` +
    `rope_scaling` (whose type key was once spelled `type`)."""
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(rope, dict) or "full_attention" in rope:
        raise CheckpointError(f"unsupported per-layer-type rope parameters {rope!r}")
    theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    fields: dict[str, Any] = {"rope_theta": float(theta), "rope_type": rope_type}
    if rope_type in ("linear", "llama3"):
        fields["rope_factor"] = float(_required_rope(rope, "factor"))
    if rope_type == "llama3":
        fields["rope_low_freq_factor"] = float(_required_rope(rope, "low_freq_factor"))
        fields["rope_high_freq_factor"] = float(_required_rope(rope, "high_freq_factor"))
        # transformers prefers a top-level `original_max_position_embeddings` (Phi-3 style)
        # over the one inside the rope dict, then falls back to max_position_embeddings.
        original = (d.get("original_max_position_embeddings")
                    or rope.get("original_max_position_embeddings")
                    or d.get("max_position_embeddings", 8192))
        fields["rope_original_max_position"] = int(original)
    return fields


def _required_rope(rope: dict[str, Any], key: str) -> float:
    if key not in rope:
        raise CheckpointError(f"rope parameters {rope!r} lack {key!r}")
    return float(rope[key])
