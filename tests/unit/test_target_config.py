"""TargetConfig.from_hf: both transformers config layouts (4.x `rope_theta` + `rope_scaling`,
5.x `rope_parameters`), Llama 3.1 RoPE scaling computed exactly as transformers does, and a
CheckpointError for every variant the target does not implement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ddtree.errors import CheckpointError
from ddtree.models.target import load_target
from ddtree.models.target_config import TargetConfig

LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 100,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 256, "tie_word_embeddings": True, "bos_token_id": 1,
    "eos_token_id": 2, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
}
QWEN3 = {
    "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 100,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "rope_theta": 1000000.0, "eos_token_id": [5, 7], "layer_types": ["full_attention"] * 2,
    "use_sliding_window": False, "sliding_window": None,
}


def test_llama_fields() -> None:
    c = TargetConfig.from_hf(LLAMA)
    assert (c.family, c.vocab_size, c.hidden_size, c.intermediate_size) == ("llama", 100, 64, 128)
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (2, 4, 2, 16)
    assert (c.rope_theta, c.rms_norm_eps, c.max_position_embeddings) == (500000.0, 1e-5, 256)
    assert c.tie_word_embeddings and not c.qk_norm and not c.attention_bias
    assert (c.eos_token_ids, c.bos_token_id, c.rope_type) == ((2,), 1, "default")


def test_qwen3_fields_from_the_transformers_4_layout() -> None:
    c = TargetConfig.from_hf(QWEN3)
    assert (c.family, c.head_dim, c.rope_theta, c.eos_token_ids) == ("qwen3", 32, 1e6, (5, 7))
    assert c.qk_norm and not c.tie_word_embeddings


def test_qwen2_has_qkv_bias_only() -> None:
    c = TargetConfig.from_hf(QWEN3 | {"model_type": "qwen2", "architectures": None})
    assert c.family == "qwen2" and c.attention_bias and not c.o_proj_bias and not c.qk_norm


def test_rope_theta_and_rope_parameters_layouts_agree() -> None:
    old = {k: v for k, v in LLAMA.items() if k != "rope_parameters"} | {"rope_theta": 5e5}
    assert TargetConfig.from_hf(old) == TargetConfig.from_hf(LLAMA)


@pytest.mark.parametrize("change,message", [
    ({"model_type": "mistral"}, "unsupported model_type 'mistral'"),
    ({"model_type": None}, "unsupported model_type None"),
    ({"architectures": ["DFlashDraftModel"]}, "unsupported architectures"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"num_key_value_heads": 3}, "not a multiple"),
    ({"vocab_size": None}, "vocab_size"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}},
     "unsupported rope_type 'yarn'"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4}}, "factor"),
])
def test_unsupported_llama_variants_are_checkpoint_errors(change: dict, message: str) -> None:
    with pytest.raises(CheckpointError, match=message):
        TargetConfig.from_hf(LLAMA | change)


def test_sliding_window_layers_are_checkpoint_errors() -> None:
    with pytest.raises(CheckpointError, match="sliding"):
        TargetConfig.from_hf(QWEN3 | {"layer_types": ["full_attention", "sliding_attention"]})
    with pytest.raises(CheckpointError, match="sliding"):
        TargetConfig.from_hf(QWEN3 | {"use_sliding_window": True})


LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               # wavelengths of head_dim 16 straddle 64/4 and 64/1: all three regimes occur
               "original_max_position_embeddings": 64}


def save_llama(path: Path, rope_parameters: dict) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=256, rope_parameters=rope_parameters)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(8.0)  # large enough weights that RoPE differences show in the logits
    model.save_pretrained(path)
    return path


def logits_of(model, ids: torch.Tensor) -> torch.Tensor:
    return model.causal(ids).logits


def test_llama3_rope_scaling_matches_transformers(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    path = save_llama(tmp_path, LLAMA3_ROPE)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model = load_target(path, "cpu", torch.float32)
    assert model.config.rope_type == "llama3"
    assert torch.equal(model.rotary.inv_freq, hf.model.rotary_emb.inv_freq)
    ids = torch.randint(0, 100, (1, 60), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf(ids).logits
    torch.testing.assert_close(logits_of(model, ids), expected, rtol=1e-4, atol=1e-4)
    default = save_llama(tmp_path / "default", {"rope_type": "default", "rope_theta": 1e4})
    unscaled = load_target(default, "cpu", torch.float32)  # same seed, same weights
    assert not torch.allclose(logits_of(unscaled, ids), expected, atol=1e-2)


def test_checkpoint_in_the_transformers_4_rope_layout_loads_the_same(tmp_path: Path) -> None:
    path = save_llama(tmp_path, {"rope_type": "default", "rope_theta": 2000.0})
    new = logits_of(load_target(path, "cpu", torch.float32), torch.tensor([[1, 5, 9, 4]]))
    config = json.loads((path / "config.json").read_text())
    config["rope_theta"] = config.pop("rope_parameters")["rope_theta"]
    (path / "config.json").write_text(json.dumps(config))
    old = load_target(path, "cpu", torch.float32)
    assert old.config.rope_theta == 2000.0
    assert torch.equal(logits_of(old, torch.tensor([[1, 5, 9, 4]])), new)
