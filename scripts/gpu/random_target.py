"""A Llama-shaped target checkpoint with random bf16 weights, built on the GPU host from a
config.json and tokenizer files carried in ~1 MB: the demo target's shapes without its
~100 MB GGUF (nine staging calls). For timing what does not depend on the weights' values
(ar steps, the services' path, MPS); its drafter accepts ~nothing, so trees mean nothing
on it. Weights as ddtree/models/tiny.py draws them (embeddings std 0.3, linear layers
3 / sqrt(fan_in)), so greedy decoding is varied; EOS is rare, so requests run to max_tokens.

    python3 scripts/gpu/random_target.py SRC_DIR OUT_DIR
SRC_DIR: config.json, tokenizer.json(.gz), tokenizer_config.json, chat_template.jinja,
generation_config.json (what `ddtree models pull smollm2` writes beside its weights).
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from ddtree.models.tiny import EMBED_STD, LINEAR_GAIN


def random_weights(config: dict, device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator(device=device).manual_seed(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads

    def normal(rows: int, cols: int, std: float) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=generator, device=device) * std).to(
            torch.bfloat16).cpu()

    def linear(rows: int, cols: int) -> torch.Tensor:
        return normal(rows, cols, LINEAR_GAIN / cols ** 0.5)

    ones = torch.ones(hidden, dtype=torch.bfloat16)
    out = {"model.embed_tokens.weight": normal(config["vocab_size"], hidden, EMBED_STD),
           "model.norm.weight": ones.clone()}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out |= {p + "self_attn.q_proj.weight": linear(heads * head_dim, hidden),
                p + "self_attn.k_proj.weight": linear(kv_heads * head_dim, hidden),
                p + "self_attn.v_proj.weight": linear(kv_heads * head_dim, hidden),
                p + "self_attn.o_proj.weight": linear(hidden, heads * head_dim),
                p + "mlp.gate_proj.weight": linear(inter, hidden),
                p + "mlp.up_proj.weight": linear(inter, hidden),
                p + "mlp.down_proj.weight": linear(hidden, inter),
                p + "input_layernorm.weight": ones.clone(),
                p + "post_attention_layernorm.weight": ones.clone()}
    if not config.get("tie_word_embeddings", False):
        out["lm_head.weight"] = normal(config["vocab_size"], hidden, EMBED_STD)
    return out


def main() -> int:
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.name == "tokenizer.json.gz":
            (out / "tokenizer.json").write_bytes(gzip.decompress(path.read_bytes()))
        elif path.suffix in (".json", ".jinja"):
            shutil.copy(path, out / path.name)
    config = json.loads((out / "config.json").read_text())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    save_file(random_weights(config, device), str(out / "model.safetensors"),
              metadata={"format": "pt"})
    print(f"random target in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
