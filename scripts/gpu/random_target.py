"""A target checkpoint of a carried config's shapes with random bf16 weights, built on the
GPU host from its config.json and tokenizer files (~1 MB): the demo target's shapes without
its ~100 MB GGUF (nine staging calls). For timing what does not depend on the weights'
values (ar steps, the services' path, MPS); its drafter accepts ~nothing, so trees mean
nothing on it. The weights are drawn as ddtree/models/tiny.py draws them
(`tiny.init_weights`: varied greedy tokens); EOS is rare, so requests run to max_tokens.

    python3 scripts/gpu/random_target.py SRC_DIR OUT_DIR
SRC_DIR: config.json, tokenizer.json(.gz), tokenizer_config.json, chat_template.jinja,
generation_config.json (what `ddtree models pull smollm2` writes beside its weights).
"""

from __future__ import annotations

import gzip
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ddtree.models.tiny import EMBED_STD, LINEAR_GAIN, init_weights


def main() -> int:
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.name == "tokenizer.json.gz":
            (out / "tokenizer.json").write_bytes(gzip.decompress(path.read_bytes()))
        elif path.suffix in (".json", ".jinja"):
            shutil.copy(path, out / path.name)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out))
    init_weights(model, torch.Generator().manual_seed(0), EMBED_STD, LINEAR_GAIN)
    model.to(torch.bfloat16).save_pretrained(out)
    print(f"random target in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
