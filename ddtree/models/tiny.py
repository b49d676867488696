"""Tiny random target + DFlash drafter pairs written in the real on-disk formats, so CPU
tests, the CLI and the services run end to end in seconds without downloading anything.

`out_dir/target`: a transformers `LlamaForCausalLM` (tied embeddings, like SmolLM2) or
`Qwen3ForCausalLM` (untied, q/k norms, like Qwen3-8B) saved with `save_pretrained`, plus a
byte-level BPE tokenizer trained on a few built-in sentences, with a ChatML chat template and
`<|im_end|>` as end of turn. `out_dir/drafter`: a random `DFlashDrafter` in z-lab's format
that fits the target; the llama pair uses a learned `mask_embedding` (SmolLM2 has no spare
vocabulary row), the qwen3 pair `mask_token_id` = `<|mask|>` (as z-lab's Qwen3 drafters).

Random init at HF's std 0.02 gives nearly uniform logits, greedy ties and (with tied
embeddings) a model that repeats its input token forever. We draw larger weights instead:
embeddings std 0.3 and linear layers std `gain / sqrt(fan_in)` with gain 3, so the layers
dominate the residual stream and greedy decoding is well defined and varied.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from torch import nn

from ddtree.models.drafter import DFlashDrafter, DrafterConfig, save_drafter

Family = Literal["llama", "qwen3"]

VOCAB_SIZE = 384
HIDDEN_SIZE = 64
NUM_TARGET_LAYERS = 4
NUM_DRAFT_LAYERS = 2
BLOCK_SIZE = 8
# The default rule round(1 + i*(N-4)/(k-1)) collapses to [1, 1] for a 4-layer target.
TARGET_LAYER_IDS = (1, 2)
EMBED_STD = 0.3
LINEAR_GAIN = 3.0
DRAFT_LINEAR_GAIN = 1.0

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>")
PAD_TOKEN, END_OF_TURN, MASK_TOKEN = "<|endoftext|>", "<|im_end|>", "<|mask|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Enough text for the BPE trainer to fill the vocabulary with merges.
CORPUS = (
    "The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.",
    "Speculative decoding drafts several tokens; the target verifies them in one forward.",
    "A draft tree holds the most probable prefixes under a node budget.",
    "Hello! How are you today? I am fine, thank you. What is the capital of France? Paris.",
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(add(i, i))\n",
    "import torch\nclass Model(nn.Module):\n    def forward(self, x):\n        return x * 2\n",
    "Write a short poem about the sea. The waves are blue and the wind is cold.",
)


def make_tiny_pair(out_dir: Path | str, family: Family = "llama",
                   seed: int = 0) -> tuple[Path, Path]:
    """Writes `out_dir/target` and `out_dir/drafter` and returns those two paths."""
    if family not in ("llama", "qwen3"):
        raise ValueError(f"family must be 'llama' or 'qwen3', got {family!r}")
    out_dir = Path(out_dir)
    target_dir, drafter_dir = out_dir / "target", out_dir / "drafter"
    tokenizer = build_tokenizer()
    target = build_target(family, seed, eos_token_id=tokenizer.convert_tokens_to_ids(END_OF_TURN),
                          pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN))
    target.save_pretrained(str(target_dir))
    tokenizer.save_pretrained(str(target_dir))
    mask_token_id = None if family == "llama" else tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    drafter = build_drafter(target.config.to_dict(), seed, mask_token_id)
    save_drafter(drafter, drafter_dir)
    return target_dir, drafter_dir


def build_tokenizer():  # noqa: ANN201 (a transformers fast tokenizer)
    """A byte-level BPE tokenizer of exactly VOCAB_SIZE tokens, ids 0-3 the special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer)
    # Should the trainer run out of merges, reserved tokens keep every model row decodable.
    missing = VOCAB_SIZE - tokenizer.get_vocab_size()
    tokenizer.add_special_tokens([f"<|reserved_{i}|>" for i in range(missing)])
    assert tokenizer.get_vocab_size() == VOCAB_SIZE, tokenizer.get_vocab_size()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=END_OF_TURN, pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE, model_max_length=1024)


def build_target(family: Family, seed: int, eos_token_id: int, pad_token_id: int) -> nn.Module:
    """A random transformers causal LM of the family, with the large init described above."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(
        vocab_size=VOCAB_SIZE, hidden_size=HIDDEN_SIZE, intermediate_size=2 * HIDDEN_SIZE,
        num_hidden_layers=NUM_TARGET_LAYERS, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, max_position_embeddings=1024,
        bos_token_id=None, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
    )
    model: nn.Module
    if family == "llama":  # SmolLM2-like: tied embeddings, eps 1e-5, theta 1e4
        model = LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=True, rms_norm_eps=1e-5,
                                             rope_parameters=_rope(10_000.0)))
    else:  # Qwen3-like: untied, q/k norms, eps 1e-6, theta 1e6
        model = Qwen3ForCausalLM(Qwen3Config(**common, tie_word_embeddings=False,
                                             rms_norm_eps=1e-6, rope_parameters=_rope(1e6)))
    init_weights(model, torch.Generator().manual_seed(seed), EMBED_STD, LINEAR_GAIN)
    return model.eval()


def build_drafter(target_config: dict, seed: int, mask_token_id: int | None) -> DFlashDrafter:
    """A random DFlash drafter fitting `target_config` (an HF config dict); a learned
    `mask_embedding` when `mask_token_id` is None."""
    rope = target_config.get("rope_parameters") or {}
    config = DrafterConfig(
        hidden_size=target_config["hidden_size"], num_hidden_layers=NUM_DRAFT_LAYERS,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=2 * target_config["hidden_size"],
        vocab_size=target_config["vocab_size"], block_size=BLOCK_SIZE,
        num_target_layers=target_config["num_hidden_layers"],
        target_layer_ids=TARGET_LAYER_IDS, mask_token_id=mask_token_id,
        has_mask_embedding=mask_token_id is None, rms_norm_eps=1e-6,
        rope_theta=float(rope.get("rope_theta", target_config.get("rope_theta", 10000.0))),
        max_position_embeddings=target_config["max_position_embeddings"],
    )
    drafter = DFlashDrafter(config)
    # A different stream from the target's, so the drafter is not a function of its weights.
    init_weights(drafter, torch.Generator().manual_seed(seed + 1), EMBED_STD, DRAFT_LINEAR_GAIN)
    return drafter.eval()


def _rope(theta: float) -> dict:
    return {"rope_type": "default", "rope_theta": theta}


@torch.no_grad()
def init_weights(model: nn.Module, generator: torch.Generator, embed_std: float,
                 gain: float) -> None:
    """Matrices: embeddings / LM head std `embed_std`, linear layers `gain / sqrt(fan_in)`;
    the `mask_embedding` vector like an embedding row; norm weights stay 1."""
    for name, param in model.named_parameters():
        if name.endswith("mask_embedding"):
            std = embed_std
        elif param.ndim < 2:
            continue
        elif "embed_tokens" in name or "lm_head" in name:
            std = embed_std
        else:
            std = gain / param.shape[1] ** 0.5
        param.copy_(torch.randn(param.shape, generator=generator) * std)
