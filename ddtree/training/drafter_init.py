"""How a drafter in training starts: its shape from the target's config and ours
(`drafter_config_for`), random weights (`init_drafter`), or an earlier checkpoint, also one
of a smaller shape (`grow_into`).

`grow_into` copies a trained drafter into a drafter with as many or more layers, a wider
or equal MLP and a superset of its target layers so that the new drafter computes exactly
the old one's drafts at step 0 (a function-preserving start, Net2Net-style):
- old layers keep their weights; added MLP units get random gate/up rows and ZERO
  down-projection columns (they add nothing until trained);
- added layers keep their random q/k/v/gate/up but get zero `o_proj` and `down_proj`, so
  their residual branches add nothing: each is the identity at first;
- `fc` columns of the old target layers are copied into the new layout, those of added
  target layers are zero (`hidden_norm` follows `fc`, so zero columns change nothing);
- norms and `mask_embedding` are copied.
A narrower MLP or a dropped target layer cannot be preserved: such shapes are refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ddtree.errors import InvalidArgumentError
from ddtree.models.checkpoint import read_config, read_tensors
from ddtree.models.drafter import MASK_EMBEDDING, DFlashDrafter
from ddtree.models.drafter_config import DrafterConfig, default_target_layer_ids

if TYPE_CHECKING:
    from ddtree.training.trainer import TrainConfig


def drafter_config_for(target_hf: dict[str, Any], config: TrainConfig) -> DrafterConfig:
    """The drafter's shape: the target's hidden size, heads, RoPE and vocabulary (it
    shares the target's embeddings and positions), our depth / width / feature layers."""
    num_target_layers = int(target_hf["num_hidden_layers"])
    layer_ids = config.target_layer_ids or default_target_layer_ids(
        num_target_layers, config.num_layers)
    heads = int(target_hf["num_attention_heads"])
    rope = target_hf.get("rope_parameters") or {}
    return DrafterConfig(
        hidden_size=int(target_hf["hidden_size"]), num_hidden_layers=config.num_layers,
        num_attention_heads=heads,
        num_key_value_heads=int(target_hf.get("num_key_value_heads") or heads),
        head_dim=int(target_hf.get("head_dim") or target_hf["hidden_size"] // heads),
        intermediate_size=config.intermediate_size or int(target_hf["intermediate_size"]),
        vocab_size=int(target_hf["vocab_size"]), block_size=config.block_size,
        num_target_layers=num_target_layers, target_layer_ids=tuple(layer_ids),
        mask_token_id=None, has_mask_embedding=True,
        rms_norm_eps=float(target_hf.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", target_hf.get("rope_theta", 10000.0))),
        max_position_embeddings=int(target_hf.get("max_position_embeddings", 8192)),
        extra={k: target_hf[k] for k in ("bos_token_id", "eos_token_id") if k in target_hf})


def init_drafter(drafter: DFlashDrafter, final_norm: Tensor, generator: torch.Generator) -> None:
    """Linear weights and `mask_embedding` ~ N(0, 0.02) (the HF initializer); `norm` starts
    as the target's final norm, so the borrowed LM head sees inputs at the scale it was
    trained on (a smaller norm would have to grow for thousands of steps before logits
    could be confident). Measured on SmolLM2: a mask row set to the mean embedding instead
    starts at loss ~100 rather than ~38 (the mean is a direction every embedding shares)."""
    with torch.no_grad():
        for module in drafter.modules():
            if isinstance(module, nn.Linear):
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * 0.02)
        drafter.norm.weight.copy_(final_norm)
        drafter.mask_embedding.copy_(
            torch.randn(drafter.mask_embedding.shape, generator=generator) * 0.02)


def read_drafter_state(path: Path) -> tuple[DrafterConfig, dict[str, Tensor]]:
    """(config, float32 CPU tensors) of the drafter checkpoint in `path`."""
    tensors = read_tensors(Path(path), "cpu", torch.float32,
                           select=lambda n: not n.endswith("rotary_emb.inv_freq"))
    config = DrafterConfig.from_hf(read_config(Path(path)),
                                   has_mask_embedding=MASK_EMBEDDING in tensors)
    return config, tensors


def check_growable(old: DrafterConfig, new: DrafterConfig) -> None:
    problems = []
    for field in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                  "vocab_size", "num_target_layers", "has_mask_embedding"):
        if getattr(old, field) != getattr(new, field):
            problems.append(f"{field} {getattr(old, field)} -> {getattr(new, field)}")
    if new.num_hidden_layers < old.num_hidden_layers:
        problems.append(f"fewer layers ({old.num_hidden_layers} -> {new.num_hidden_layers})")
    if new.intermediate_size < old.intermediate_size:
        problems.append(f"narrower MLP ({old.intermediate_size} -> {new.intermediate_size})")
    dropped = set(old.target_layer_ids) - set(new.target_layer_ids)
    if dropped:
        problems.append(f"target layers {sorted(dropped)} dropped")
    if problems:
        raise InvalidArgumentError("cannot start this drafter from the checkpoint: "
                                   + "; ".join(problems))


@torch.no_grad()
def grow_into(drafter: DFlashDrafter, old: DrafterConfig, tensors: dict[str, Tensor]) -> None:
    """Loads `tensors` (a drafter of shape `old`) into `drafter` (the same or a larger
    shape) as described in the module docstring."""
    new = drafter.config
    check_growable(old, new)
    params = dict(drafter.named_parameters())
    hidden, width = new.hidden_size, old.intermediate_size
    for name, value in tensors.items():
        if name == "fc.weight":
            continue
        target = params[name]
        if name.endswith("mlp.gate_proj.weight") or name.endswith("mlp.up_proj.weight"):
            target[:width].copy_(value)
        elif name.endswith("mlp.down_proj.weight"):
            target[:, :width].copy_(value)
            target[:, width:].zero_()
        else:
            target.copy_(value)
    for i in range(old.num_hidden_layers, new.num_hidden_layers):
        params[f"layers.{i}.self_attn.o_proj.weight"].zero_()
        params[f"layers.{i}.mlp.down_proj.weight"].zero_()
    fc = params["fc.weight"]  # (H, k_new * H)
    fc.zero_()
    for j, layer in enumerate(old.target_layer_ids):
        k = new.target_layer_ids.index(layer)
        old_columns = tensors["fc.weight"][:, j * hidden:(j + 1) * hidden]  # (H, H)
        fc[:, k * hidden:(k + 1) * hidden].copy_(old_columns)
