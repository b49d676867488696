"""make_tiny_pair: the pair is in the real formats (transformers and our loaders read it, the
tokenizer speaks ChatML), deterministic per seed, and the target's greedy decoding is well
defined and varied (no near-ties, no single repeated token)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ddtree.models.drafter import load_drafter
from ddtree.models.meta import causal_meta
from ddtree.models.target import load_target
from ddtree.models.tiny import VOCAB_SIZE, make_tiny_pair


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    target_dir, drafter_dir = make_tiny_pair(tmp_path_factory.mktemp(request.param),
                                             family=request.param)
    return request.param, target_dir, drafter_dir


@torch.no_grad()
def test_our_loaders_and_transformers_read_the_pair_alike(pair) -> None:
    from transformers import AutoModelForCausalLM

    family, target_dir, drafter_dir = pair
    target = load_target(target_dir, "cpu", torch.float32)
    drafter = load_drafter(drafter_dir, target.config, "cpu", torch.float32)
    assert target.config.family == family and target.config.vocab_size == VOCAB_SIZE
    assert drafter.config.has_mask_embedding == (family == "llama")
    assert (drafter.config.mask_token_id is None) == (family == "llama")
    hf = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    ids = torch.tensor([[1, 50, 60, 70, 80, 90]])
    ours = target.causal(ids).logits
    torch.testing.assert_close(ours, hf(ids).logits.float(), atol=1e-4, rtol=1e-4)


def test_tokenizer_round_trips_text_and_applies_chatml(pair) -> None:
    from transformers import AutoTokenizer

    _, target_dir, _ = pair
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    assert len(tokenizer) == VOCAB_SIZE
    assert tokenizer.eos_token == "<|im_end|>"
    text = "Hello, world! def f(x): return x * 2  # ünïcode"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert tokenizer.eos_token_id in ids


@torch.no_grad()
def test_target_greedy_decoding_is_varied_and_free_of_near_ties(pair) -> None:
    _, target_dir, _ = pair
    target = load_target(target_dir, "cpu", torch.float32)
    num_steps = 32
    for seed in range(2):
        ids = torch.randint(4, VOCAB_SIZE, (1, 6), generator=torch.Generator().manual_seed(seed))
        pool = target.new_pool(1, 6 + num_steps)
        committed = 0
        tokens = []
        for _ in range(num_steps):
            length = ids.shape[1]
            meta = causal_meta(0, committed, length, ids.device)
            logits = target(ids.view(-1), meta, pool).logits[-1]
            committed += length
            top2 = logits.topk(2).values
            assert top2[0] - top2[1] > 1e-4  # float32 noise (~1e-6) cannot flip greedy
            ids = logits.argmax()[None, None]
            tokens.append(int(ids))
        assert len(set(tokens)) >= 10, tokens


def test_same_seed_same_files_other_seed_other_weights(tmp_path: Path) -> None:
    a = make_tiny_pair(tmp_path / "a", "qwen3", seed=5)
    b = make_tiny_pair(tmp_path / "b", "qwen3", seed=5)
    c = make_tiny_pair(tmp_path / "c", "qwen3", seed=6)
    for part in range(2):
        wa, wb, wc = (load_file(p[part] / "model.safetensors") for p in (a, b, c))
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
        assert not all(torch.equal(wa[k], wc[k]) for k in wa if wa[k].ndim == 2)
