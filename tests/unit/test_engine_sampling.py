"""Lossless sampling through the WHOLE round (prefill, drafter, DDTree, tree-masked verify,
walk, KV compaction, next round), not only the walk: on a 3-token vocabulary, the first
three committed tokens of many seeded generations follow the target's own distribution."""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare

from ddtree.engine import EngineConfig, GenerationRequest, SpecParams
from ddtree.engine.generate import build_engine
from ddtree.models.drafter import DFlashDrafter, DrafterConfig
from ddtree.models.target import TargetModel
from ddtree.models.target_config import TargetConfig
from ddtree.sampling import SamplingParams

VOCAB, NUM_TOKENS, NUM_SAMPLES, TEMPERATURE = 3, 3, 3000, 0.8
PROMPT = [0, 2, 1]


def toy_pair() -> tuple[TargetModel, DFlashDrafter]:
    torch.manual_seed(0)
    target = TargetModel(TargetConfig.from_hf({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": VOCAB,
        "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "max_position_embeddings": 64, "eos_token_id": 0,
    })).eval()
    drafter = DFlashDrafter(DrafterConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        head_dim=8, intermediate_size=32, vocab_size=VOCAB, block_size=4,
        num_target_layers=2, target_layer_ids=(0, 1), has_mask_embedding=True)).eval()
    for module in (target, drafter):
        for param in module.parameters():
            torch.nn.init.normal_(param, std=0.7)  # peaked, varied distributions
    return target.fuse_weights(), drafter.fuse_weights()


def exact_distribution(target: TargetModel, temperature: float) -> torch.Tensor:
    """P(t1, t2, t3 | PROMPT) at `temperature`, from plain causal passes (fresh cache)."""
    probs = torch.zeros((VOCAB,) * NUM_TOKENS, dtype=torch.float64)
    for seq in itertools.product(range(VOCAB), repeat=NUM_TOKENS - 1):
        ids = torch.tensor([PROMPT + list(seq)])
        with torch.no_grad():
            logits = target.causal(ids).logits
        step = torch.softmax(logits[0, -NUM_TOKENS:].double() / temperature, dim=-1)
        for last in range(VOCAB):
            full = (*seq, last)
            probs[full] = step[0, full[0]] * step[1, full[1]] * step[2, full[2]]
    return probs.flatten()


def sampled_counts(target: TargetModel, drafter: DFlashDrafter, spec: SpecParams) -> torch.Tensor:
    """NUM_SAMPLES seeded generations, 64 at a time in one engine (batched rounds: a row's
    draws must not depend on its neighbours either)."""
    engine = build_engine(target, drafter, EngineConfig(
        max_num_seqs=64, max_queue=NUM_SAMPLES, max_model_len=16, max_budget=32))
    for seed in range(NUM_SAMPLES):
        engine.add_request(str(seed), GenerationRequest(
            PROMPT, NUM_TOKENS, SamplingParams(TEMPERATURE, seed=seed), spec, ignore_eos=True))
    tokens: dict[str, list[int]] = {str(seed): [] for seed in range(NUM_SAMPLES)}
    accepted_beyond_root = 0
    while engine.has_work:
        for request_id, result in engine.step():
            tokens[request_id] += result.new_tokens
            if result.finished:
                assert result.stats is not None
                accepted_beyond_root += result.stats.num_accepted_draft_tokens
    assert accepted_beyond_root > NUM_SAMPLES // 4, "drafts were (almost) never accepted"
    assert max(engine.counters.batch_sizes or [0]) > 0 and engine.counters.num_rounds < NUM_SAMPLES
    counts = torch.zeros(VOCAB**NUM_TOKENS)
    for a, b, c in tokens.values():
        counts[(a * VOCAB + b) * VOCAB + c] += 1
    return counts


@pytest.mark.parametrize("spec", [SpecParams("tree", budget=5), SpecParams("linear")])
def test_committed_tokens_are_exact_samples_of_the_target(spec: SpecParams) -> None:
    target, drafter = toy_pair()
    expected = exact_distribution(target, TEMPERATURE)
    counts = sampled_counts(target, drafter, spec)
    keep = expected * NUM_SAMPLES >= 5  # chi-square needs expected counts of 5 or more
    observed, wanted = lump(counts, keep), lump(expected, keep) * NUM_SAMPLES
    assert chisquare(observed, wanted).pvalue > 1e-3
    # The same check has power: a distribution at another temperature is rejected.
    hotter = lump(exact_distribution(target, 1.3), keep) * NUM_SAMPLES
    assert chisquare(observed, hotter).pvalue < 1e-6


def lump(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The kept cells, plus one cell holding all the others (when there are any)."""
    rest = [values[~keep].sum()[None]] if (~keep).any() else []
    return torch.cat([values[keep], *rest]).double()

