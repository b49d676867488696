"""The target model against transformers and against itself: checkpoints written by
`save_pretrained` give transformers' logits and hidden states; prefill equals token-by-token
decoding; each tree node equals a linear pass along its ancestors; compaction of an accepted
path equals having run the path linearly; batch rows with different lengths are independent."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import Tensor

from ddtree.models.kv_pool import KVPool
from ddtree.models.meta import causal_meta, tree_meta
from ddtree.models.target import TargetModel, TargetOutput, load_target
from ddtree.tree import depths_from_parents

VOCAB = 211
CASES = {
    # name: (transformers config class name, tie_word_embeddings, extra config fields)
    "llama-gqa": ("LlamaConfig", False, {}),
    "llama-tied": ("LlamaConfig", True, {"num_key_value_heads": 4}),
    # head_dim 32 != hidden / heads = 16, as in real Qwen3 checkpoints.
    "qwen3-gqa": ("Qwen3Config", False, {"head_dim": 32}),
    "qwen3-tied": ("Qwen3Config", True, {"num_key_value_heads": 1}),
    "qwen2-bias": ("Qwen2Config", False, {}),
}


def build_hf(kind: str, tied: bool, extra: dict, seed: int = 0):
    """A small transformers model with weights large enough to make logits non-trivial."""
    import transformers

    fields = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=tied, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=[2, 3])
    config = getattr(transformers, kind)(**(fields | extra))
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            param.copy_(1 + 0.2 * noise if name.endswith("norm.weight") else 0.15 * noise)
    return model


@pytest.fixture(scope="module", params=list(CASES))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(transformers model, our model loaded from its save_pretrained directory)."""
    kind, tied, extra = CASES[request.param]
    hf = build_hf(kind, tied, extra)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return hf, load_target(path, "cpu", torch.float32)


def run(model: TargetModel, ids: list[int] | Tensor, pool: KVPool, start: int,
        parents: list[int] | None = None, feature_layers: tuple[int, ...] = (),
        last_only: bool = False, slot: int = 0) -> TargetOutput:
    """One forward of `ids` in pool row `slot` after `start` committed tokens: causal, or
    a tree with these parents (node j's K/V at slot start + j). Logits (1, M, V)."""
    ids = torch.as_tensor(ids).view(-1)  # (M,)
    if parents is None:
        meta = causal_meta(slot, start, ids.shape[0], ids.device)
    else:
        parent = torch.tensor([parents])
        depth = depths_from_parents(parent)
        meta = tree_meta(torch.tensor([slot]), torch.tensor([start]), parent, depth,
                         int(depth.max()) + 1, pool.max_len)
    rows = torch.tensor([ids.shape[0] - 1]) if last_only else None
    out = model(ids, meta, pool, feature_layers, logit_rows=rows)
    features = out.features[None] if out.features is not None else None
    return TargetOutput(out.logits[None], features)


def linear(model: TargetModel, ids: list[int],
           feature_layers: tuple[int, ...] = ()) -> TargetOutput:
    """Reference: the whole sequence in one causal pass over a fresh pool."""
    return run(model, ids, model.new_pool(1, len(ids)), 0, feature_layers=feature_layers)


def prompt(n: int, seed: int = 1) -> list[int]:
    return torch.randint(4, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_logits_match_transformers(pair) -> None:
    hf, model = pair
    ids = prompt(11)
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits
    out = linear(model, ids)
    assert out.logits.dtype == torch.float32 and out.logits.shape == (1, 11, VOCAB)
    assert expected.abs().max() > 1.0  # the comparison is not between near-zero logits
    torch.testing.assert_close(out.logits, expected, rtol=1e-4, atol=1e-4)
    last = run(model, ids, model.new_pool(1, 11), 0, last_only=True)
    assert last.logits.shape == (1, 1, VOCAB) and last.features is None
    torch.testing.assert_close(last.logits, expected[:, -1:], rtol=1e-4, atol=1e-4)


def test_features_are_transformers_hidden_states_at_layer_plus_one(pair) -> None:
    hf, model = pair
    ids = prompt(7)
    with torch.no_grad():
        hidden_states = hf(torch.tensor([ids]), output_hidden_states=True).hidden_states
    layers = (1, 0, 2)  # order of the request is the order of concatenation
    for last_only in (False, True):
        out = run(model, ids, model.new_pool(1, 7), 0, feature_layers=layers,
                  last_only=last_only)
        assert out.features is not None and out.features.shape == (1, 7, 3 * 64)
        for chunk, layer in zip(out.features.split(64, dim=-1), layers, strict=True):
            torch.testing.assert_close(chunk, hidden_states[layer + 1], rtol=1e-4, atol=1e-4)
    # Pin the offset: layer 0's feature is its OUTPUT, not the embedding output.
    first = run(model, ids, model.new_pool(1, 7), 0, feature_layers=(0,)).features
    assert not torch.allclose(first, hidden_states[0], atol=1e-2)


def test_prefill_equals_token_by_token_decode(pair) -> None:
    _, model = pair
    ids = prompt(9)
    full = linear(model, ids, feature_layers=(0, 2))
    pool = model.new_pool(1, 16)
    for i, token in enumerate(ids):
        step = run(model, [token], pool, i, feature_layers=(0, 2))
        torch.testing.assert_close(step.logits[0, 0], full.logits[0, i], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(step.features[0, 0], full.features[0, i], rtol=1e-4,
                                   atol=1e-4)


def random_parents(num_nodes: int, topology: str, seed: int) -> list[int]:
    """parents of nodes 0..num_nodes-1 (node 0 is the root, parent -1, parents[i] < i)."""
    gen = torch.Generator().manual_seed(seed)
    if topology == "chain":
        return [i - 1 for i in range(num_nodes)]
    if topology == "star":
        return [-1] + [0] * (num_nodes - 1)
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, num_nodes)]


def ancestors(parents: list[int], node: int) -> list[int]:
    """node indices from the root down to `node`, inclusive."""
    chain = [node]
    while parents[chain[-1]] >= 0:
        chain.append(parents[chain[-1]])
    return chain[::-1]


@pytest.mark.parametrize("topology,num_nodes", [
    ("chain", 6), ("star", 6), ("random", 12), ("random", 9), ("single", 1)])
def test_tree_node_equals_linear_pass_along_its_ancestors(pair, topology: str,
                                                          num_nodes: int) -> None:
    _, model = pair
    prefix = prompt(5)
    parents = random_parents(num_nodes, topology, seed=num_nodes)
    tokens = prompt(num_nodes, seed=num_nodes + 7)
    pool = model.new_pool(1, len(prefix) + num_nodes)
    run(model, prefix, pool, 0)
    out = run(model, tokens, pool, len(prefix), parents=parents, feature_layers=(1,))
    for node in range(num_nodes):
        chain = [tokens[i] for i in ancestors(parents, node)]
        ref = linear(model, prefix + chain, feature_layers=(1,))
        torch.testing.assert_close(out.logits[0, node], ref.logits[0, -1], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out.features[0, node], ref.features[0, -1], rtol=1e-4,
                                   atol=1e-4)


def test_compacted_tree_path_then_decode_equals_linear_run(pair) -> None:
    _, model = pair
    prefix, tokens = prompt(6), prompt(10, seed=3)
    parents = [-1, 0, 0, 1, 2, 1, 3, 4, 6, 6]
    path = ancestors(parents, 8)  # [0, 1, 3, 6, 8]: skips siblings, so rows really move
    pool = model.new_pool(1, 32)
    run(model, prefix, pool, 0)
    run(model, tokens, pool, len(prefix), parents=parents)
    pool.compact(torch.tensor([0]), torch.tensor([len(prefix)]), torch.tensor([path]))
    committed = len(prefix) + len(path)
    following = prompt(3, seed=5)
    out = run(model, following, pool, committed)
    ref = linear(model, prefix + [tokens[i] for i in path] + following)
    torch.testing.assert_close(out.logits[0], ref.logits[0, committed:], rtol=1e-4, atol=1e-4)


def test_batch_rows_with_different_lengths_equal_each_row_alone(pair) -> None:
    _, model = pair
    prefixes = [prompt(4, seed=11), prompt(7, seed=12)]
    news = [prompt(5, seed=13), prompt(5, seed=14)]
    parent_lists = [random_parents(5, "random", seed) for seed in (1, 2)]
    singles = []
    batched = model.new_pool(3, 16)
    torch.nn.init.normal_(batched.k)  # stale garbage past a row's length must stay unseen
    torch.nn.init.normal_(batched.v)
    slots = (2, 0)  # pool rows out of order: a batch row is not a pool row
    for b in range(2):
        pool = model.new_pool(1, 16)
        run(model, prefixes[b], pool, 0)
        batched.k[:, slots[b], :len(prefixes[b])] = pool.k[:, 0, :len(prefixes[b])]
        batched.v[:, slots[b], :len(prefixes[b])] = pool.v[:, 0, :len(prefixes[b])]
        singles.append(run(model, news[b], pool, len(prefixes[b]), parents=parent_lists[b],
                           feature_layers=(0,)))
    parents = torch.tensor(parent_lists)
    depth = depths_from_parents(parents)
    meta = tree_meta(torch.tensor(slots), torch.tensor([4, 7]), parents, depth,
                     int(depth.max()) + 1, batched.max_len)
    out = model(torch.tensor(news).view(-1), meta, batched, feature_layers=(0,))
    logits, features = out.logits.view(2, 5, -1), out.features.view(2, 5, -1)
    for b in range(2):
        torch.testing.assert_close(logits[b], singles[b].logits[0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(features[b], singles[b].features[0], rtol=1e-4, atol=1e-4)


def test_kv_pool_compact_moves_the_kept_rows_of_each_row() -> None:
    pool = KVPool(num_layers=2, num_slots=3, max_len=12, num_kv_heads=3, head_dim=4,
                  device="cpu", dtype=torch.float32)
    torch.nn.init.normal_(pool.k)
    torch.nn.init.normal_(pool.v)
    old_k, old_v = pool.k.clone(), pool.v.clone()
    keep = torch.tensor([[0, 2, 3, 6], [0, 1, 4, 5]])
    slots, starts = torch.tensor([2, 0]), torch.tensor([3, 5])
    pool.compact(slots, starts, keep)
    for b, (slot, start) in enumerate(zip(slots.tolist(), starts.tolist(), strict=True)):
        for j, offset in enumerate(keep[b].tolist()):
            assert torch.equal(pool.k[:, slot, start + j], old_k[:, slot, start + offset])
            assert torch.equal(pool.v[:, slot, start + j], old_v[:, slot, start + offset])
        assert torch.equal(pool.k[:, slot, :start], old_k[:, slot, :start])  # committed rows
    assert torch.equal(pool.k[:, 1], old_k[:, 1])  # other pool rows untouched


def test_tied_embeddings_share_one_tensor(pair) -> None:
    hf, model = pair
    embeddings = model.embeddings
    tied = hf.config.tie_word_embeddings
    assert (embeddings.lm_head.weight is embeddings.embed_tokens.weight) == tied
    assert model.config.tie_word_embeddings == tied


def test_loaded_target_is_frozen_in_eval_mode_and_in_the_requested_dtype(
        tmp_path: Path) -> None:
    build_hf("Qwen3Config", False, {}).save_pretrained(tmp_path)
    model = load_target(tmp_path, "cpu", torch.bfloat16)
    assert not model.training
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in model.parameters())
    assert model.rotary.inv_freq.dtype == torch.float32
    pool = model.new_pool(1, 8)
    assert pool.k.dtype == torch.bfloat16
    out = run(model, prompt(8), pool, 0)
    assert out.logits.dtype == torch.float32 and torch.isfinite(out.logits).all()
