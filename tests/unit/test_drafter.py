"""The DFlash drafter: z-lab's checkpoint format loads and round-trips bit-exactly; the
inference path (cached context K/V, `draft`) equals the training path (`forward_blocks`
with a block mask); chunked appends and batch rows of different lengths change nothing;
every pair that does not fit is an IncompatibleModelsError naming the problem."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from ddtree.errors import CheckpointError, IncompatibleModelsError
from ddtree.kernels import tree_attention
from ddtree.models.drafter import (
    DFlashDrafter,
    DrafterConfig,
    load_drafter,
    save_drafter,
)
from ddtree.models.drafter_config import default_target_layer_ids
from ddtree.models.target import TargetEmbeddings
from ddtree.models.target_config import TargetConfig

H, V, NUM_TARGET_LAYERS, BLOCK = 32, 97, 8, 6
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, NUM_LAYERS = 4, 2, 8, 2
LAYER_IDS = [1, 3, 5]
MASK_ID = 96

# Field for field the config.json of z-lab/Qwen3-8B-DFlash-b16, shrunk.
ZLAB_CONFIG: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
    "block_size": BLOCK,
    "bos_token_id": 151643,
    "dflash_config": {"mask_token_id": MASK_ID, "target_layer_ids": LAYER_IDS},
    "dtype": "bfloat16",
    "eos_token_id": 151645,
    "head_dim": HEAD_DIM,
    "hidden_act": "silu",
    "hidden_size": H,
    "initializer_range": 0.02,
    "intermediate_size": 48,
    "layer_types": ["full_attention"] * NUM_LAYERS,
    "max_position_embeddings": 40960,
    "max_window_layers": NUM_LAYERS,
    "model_type": "qwen3",
    "num_attention_heads": NUM_HEADS,
    "num_hidden_layers": NUM_LAYERS,
    "num_key_value_heads": NUM_KV_HEADS,
    "num_target_layers": NUM_TARGET_LAYERS,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "transformers_version": "4.57.1",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": V,
}
TARGET = TargetConfig(family="qwen3", vocab_size=V, hidden_size=H, intermediate_size=64,
                      num_layers=NUM_TARGET_LAYERS, num_heads=4, num_kv_heads=2, head_dim=8)


def zlab_weights(config: dict[str, Any], mask_embedding: bool = False,
                 seed: int = 0) -> dict[str, torch.Tensor]:
    """Weights named exactly as in z-lab's safetensors (spelled out, not our state_dict)."""
    g = torch.Generator().manual_seed(seed)
    hidden, d = config["hidden_size"], config["head_dim"]
    q_dim, kv_dim = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    inter, k = config["intermediate_size"], len(config["dflash_config"]["target_layer_ids"])
    shapes = {"fc.weight": (hidden, k * hidden), "hidden_norm.weight": (hidden,),
              "norm.weight": (hidden,)}
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (q_dim, hidden),
                   p + "self_attn.k_proj.weight": (kv_dim, hidden),
                   p + "self_attn.v_proj.weight": (kv_dim, hidden),
                   p + "self_attn.o_proj.weight": (hidden, q_dim),
                   p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
                   p + "mlp.gate_proj.weight": (inter, hidden),
                   p + "mlp.up_proj.weight": (inter, hidden),
                   p + "mlp.down_proj.weight": (hidden, inter),
                   p + "input_layernorm.weight": (hidden,),
                   p + "post_attention_layernorm.weight": (hidden,)}
    if mask_embedding:
        shapes["mask_embedding"] = (hidden,)
    # Norm weights near 1, matrices at unit gain: outputs far from uniform.
    return {name: (1 + 0.1 * torch.randn(s, generator=g)) if len(s) == 1 and "mask" not in name
            else torch.randn(s, generator=g) / s[-1] ** 0.5 for name, s in shapes.items()}


def write_zlab(path: Path, config: dict[str, Any] | None = None, mask_embedding: bool = False,
               **overrides: Any) -> Path:
    config = copy.deepcopy(config or ZLAB_CONFIG) | overrides
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    weights = zlab_weights(config, mask_embedding)
    save_file({k: v.to(torch.bfloat16) for k, v in weights.items()}, path / "model.safetensors")
    return path


@pytest.fixture(scope="module")
def drafter(tmp_path_factory: pytest.TempPathFactory) -> DFlashDrafter:
    return load_drafter(write_zlab(tmp_path_factory.mktemp("zlab")), TARGET, "cpu", torch.float32)


@pytest.fixture(scope="module")
def embeddings() -> TargetEmbeddings:
    torch.manual_seed(1)
    emb = TargetEmbeddings(V, H, tie_word_embeddings=False)
    torch.nn.init.normal_(emb.embed_tokens.weight, std=0.5)
    torch.nn.init.normal_(emb.lm_head.weight, std=0.5)
    return emb.eval()


def fused_context(drafter: DFlashDrafter, batch: int, length: int, seed: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(batch, length, len(LAYER_IDS) * H, generator=g)  # (B, S, k*H)
    return drafter.fuse(features)


def draft_after(drafter: DFlashDrafter, embeddings: TargetEmbeddings, fused: torch.Tensor,
                lens: list[int], bonus: torch.Tensor, chunks: tuple[int, ...] = ()) -> torch.Tensor:
    """Appends `fused` (B, S, H) (in `chunks` if given), sets the lengths to `lens` and drafts."""
    batch, length, _ = fused.shape
    pool = drafter.new_pool(batch + 1, length + 2 * BLOCK + 5)
    slots = torch.arange(batch, 0, -1)  # pool rows differ from batch rows
    start = 0
    for end in (*chunks, length):
        drafter.append_context(pool, slots, torch.full((batch,), start), fused[:, start:end])
        start = end
    return drafter.draft(pool, slots, torch.tensor(lens), bonus, embeddings)


@torch.no_grad()
def test_zlab_checkpoint_loads_with_its_names_and_config(tmp_path: Path) -> None:
    path = write_zlab(tmp_path / "d")
    loaded = load_drafter(path, TARGET, "cpu", torch.float32)
    c = loaded.config
    assert (c.block_size, c.target_layer_ids, c.mask_token_id) == (BLOCK, tuple(LAYER_IDS), MASK_ID)
    assert not c.has_mask_embedding and loaded.mask_embedding is None
    assert (c.num_key_value_heads, c.head_dim, c.rope_theta) == (NUM_KV_HEADS, HEAD_DIM, 1e6)
    expected = zlab_weights(ZLAB_CONFIG)
    state = loaded.state_dict()
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[n], expected[n].to(torch.bfloat16).float()) for n in state)


def test_default_target_layer_ids_follow_zlab_rule(tmp_path: Path) -> None:
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)
    assert default_target_layer_ids(28, 5) == (1, 7, 13, 19, 25)
    assert default_target_layer_ids(36, 1) == (18,)
    config = copy.deepcopy(ZLAB_CONFIG)
    config["dflash_config"] = {"mask_token_id": MASK_ID}
    config |= {"num_target_layers": 36, "num_hidden_layers": 5}
    assert DrafterConfig.from_hf(config).target_layer_ids == (1, 9, 17, 25, 33)


def test_config_parses_both_zlab_layouts_and_round_trips() -> None:
    newer = copy.deepcopy(ZLAB_CONFIG)
    del newer["block_size"], newer["rope_theta"]
    newer["dflash_config"]["block_size"] = BLOCK
    newer["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6}
    assert DrafterConfig.from_hf(newer) == DrafterConfig.from_hf(ZLAB_CONFIG)
    config = DrafterConfig.from_hf(ZLAB_CONFIG, has_mask_embedding=True)
    assert DrafterConfig.from_hf(config.to_hf(), has_mask_embedding=True) == config
    hf = config.to_hf()
    for key in ("architectures", "auto_map", "model_type", "block_size", "num_target_layers",
                "hidden_size", "head_dim", "rope_theta", "bos_token_id", "eos_token_id"):
        assert hf[key] == ZLAB_CONFIG[key], key
    assert hf["dflash_config"] == ZLAB_CONFIG["dflash_config"] | {"block_size": BLOCK}


@torch.no_grad()
def test_draft_equals_forward_blocks_on_one_block(drafter, embeddings) -> None:
    length = 11
    fused = fused_context(drafter, 1, length)
    bonus = torch.tensor([5])
    drafted = draft_after(drafter, embeddings, fused, [length], bonus)
    block = drafter.block_embeddings(bonus[:, None], embeddings, BLOCK)  # (1, b, H)
    hidden = drafter.forward_blocks(
        fused, torch.arange(length)[None], block, torch.arange(length, length + BLOCK)[None],
        torch.ones(1, BLOCK, length + BLOCK, dtype=torch.bool))
    reference = embeddings.logits(hidden[:, 1:])
    assert drafted.shape == (1, BLOCK - 1, V) and drafted.dtype == torch.float32
    torch.testing.assert_close(drafted, reference, atol=1e-5, rtol=1e-5)
    assert drafted.std(-1).min() > 0.5  # far from uniform: the comparison means something


@torch.no_grad()
def test_forward_blocks_with_a_block_mask_equals_one_draft_per_anchor(drafter, embeddings) -> None:
    """The training layout: blocks at anchors 4 and 9 in one forward; each block sees the
    context before its anchor and its own block, never the other block."""
    length, anchors, tokens = 14, (4, 9), torch.tensor([[7, 11]])
    fused = fused_context(drafter, 1, length)
    blocks = drafter.block_embeddings(tokens, embeddings, BLOCK)  # (1, 2b, H)
    positions = torch.cat([torch.arange(a, a + BLOCK) for a in anchors])[None]  # (1, 2b)
    visible = torch.zeros(1, 2 * BLOCK, length + 2 * BLOCK, dtype=torch.bool)
    for i, anchor in enumerate(anchors):
        rows = slice(i * BLOCK, (i + 1) * BLOCK)
        visible[0, rows, :anchor] = True
        visible[0, rows, length + i * BLOCK:length + (i + 1) * BLOCK] = True
    hidden = drafter.forward_blocks(fused, torch.arange(length)[None], blocks, positions, visible)
    for i, anchor in enumerate(anchors):
        drafted = draft_after(drafter, embeddings, fused[:, :anchor], [anchor], tokens[:, i])
        expected = embeddings.logits(hidden[:, i * BLOCK + 1:(i + 1) * BLOCK])
        torch.testing.assert_close(drafted, expected, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_appending_context_in_chunks_equals_one_chunk(drafter, embeddings) -> None:
    fused = fused_context(drafter, 1, 12)
    bonus = torch.tensor([3])
    whole = draft_after(drafter, embeddings, fused, [12], bonus)
    chunked = draft_after(drafter, embeddings, fused, [12], bonus, chunks=(1, 5, 11))
    torch.testing.assert_close(chunked, whole, atol=2e-5, rtol=1e-5)  # matmul blocking differs


@torch.no_grad()
def test_batch_rows_with_different_lengths_equal_each_row_alone(drafter, embeddings) -> None:
    """Row 0 holds 12 slots but commits 7: slots 7..11 must be invisible to it."""
    fused = fused_context(drafter, 2, 12)
    bonus = torch.tensor([8, 40])
    both = draft_after(drafter, embeddings, fused, [7, 12], bonus)
    first = draft_after(drafter, embeddings, fused[:1, :7], [7], bonus[:1])
    second = draft_after(drafter, embeddings, fused[1:], [12], bonus[1:])
    torch.testing.assert_close(both, torch.cat([first, second]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mask_embedding", [False, True])
@torch.no_grad()
def test_save_load_round_trip_is_bit_exact(tmp_path: Path, embeddings, mask_embedding) -> None:
    original = load_drafter(write_zlab(tmp_path / "a", mask_embedding=mask_embedding),
                            TARGET, "cpu", torch.float32)
    save_drafter(original, tmp_path / "b")
    again = load_drafter(tmp_path / "b", TARGET, "cpu", torch.float32)
    assert again.config == original.config
    a, b = original.state_dict(), again.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert ("mask_embedding" in b) == mask_embedding
    fused = fused_context(original, 1, 6)
    bonus = torch.tensor([1])
    assert torch.equal(draft_after(original, embeddings, fused, [6], bonus),
                       draft_after(again, embeddings, fused, [6], bonus))


@torch.no_grad()
def test_mask_rows_use_mask_embedding_when_present_else_mask_token(tmp_path: Path,
                                                                   embeddings) -> None:
    bonus = torch.tensor([[4, 9]])
    by_id = load_drafter(write_zlab(tmp_path / "id"), TARGET, "cpu", torch.float32)
    rows = by_id.block_embeddings(bonus, embeddings, BLOCK).view(1, 2, BLOCK, H)
    assert torch.equal(rows[0, :, 0], embeddings.embed(bonus)[0])
    assert torch.equal(rows[0, 1, 3], embeddings.embed(torch.tensor([[MASK_ID]]))[0, 0])
    # Both present (and an id outside the vocabulary): the learned vector wins, no error.
    config = copy.deepcopy(ZLAB_CONFIG)
    config["dflash_config"]["mask_token_id"] = V + 10
    learned = load_drafter(write_zlab(tmp_path / "emb", config, mask_embedding=True),
                           TARGET, "cpu", torch.float32)
    rows = learned.block_embeddings(bonus, embeddings, BLOCK).view(1, 2, BLOCK, H)
    assert torch.equal(rows[0, 0, 1:], learned.mask_embedding.expand(BLOCK - 1, H))
    assert torch.equal(rows[0, :, 0], embeddings.embed(bonus)[0])


def _without_mask_id(config: dict[str, Any]) -> dict[str, Any]:
    config["dflash_config"] = {"target_layer_ids": LAYER_IDS}
    return config


INCOMPATIBLE = {
    "hidden": (lambda c: c | {"hidden_size": 48}, "hidden_size 48 != target's 32"),
    "vocab": (lambda c: c | {"vocab_size": 120}, "vocab_size 120 != target's 97"),
    "layer_ids": (lambda c: c | {"dflash_config": {"mask_token_id": 1,
                                                   "target_layer_ids": [1, 3, 8]}},
                  r"target_layer_ids \[8\] outside"),
    "num_target_layers": (lambda c: c | {"num_target_layers": 36}, "36-layer target"),
    "no_mask": (_without_mask_id, "no dflash_config.mask_token_id and no mask_embedding"),
    "mask_id": (lambda c: c | {"dflash_config": {"mask_token_id": V,
                                                 "target_layer_ids": LAYER_IDS}},
                "mask_token_id 97 outside"),
}


@pytest.mark.parametrize("case", list(INCOMPATIBLE))
def test_pairs_that_do_not_fit_raise_incompatible_models(tmp_path: Path, case: str) -> None:
    edit, message = INCOMPATIBLE[case]
    path = write_zlab(tmp_path / case, edit(copy.deepcopy(ZLAB_CONFIG)))
    with pytest.raises(IncompatibleModelsError, match=message):
        load_drafter(path, TARGET, "cpu", torch.float32)


def test_broken_checkpoints_raise_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_drafter(tmp_path / "nowhere", TARGET, "cpu", torch.float32)
    path = write_zlab(tmp_path / "d")
    (path / "model.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(CheckpointError, match="corrupt"):
        load_drafter(path, TARGET, "cpu", torch.float32)
    config = copy.deepcopy(ZLAB_CONFIG)
    del config["block_size"]
    with pytest.raises(CheckpointError, match="block_size"):
        load_drafter(write_zlab(tmp_path / "e", config), TARGET, "cpu", torch.float32)
    path = write_zlab(tmp_path / "f")
    weights = zlab_weights(ZLAB_CONFIG)
    del weights["norm.weight"]
    save_file(weights, path / "model.safetensors")
    with pytest.raises(CheckpointError, match="norm.weight"):
        load_drafter(path, TARGET, "cpu", torch.float32)
    weights = zlab_weights(ZLAB_CONFIG) | {"fc.weight": torch.zeros(H, 2 * H)}
    save_file(weights, path / "model.safetensors")
    with pytest.raises(CheckpointError, match="fc.weight"):
        load_drafter(path, TARGET, "cpu", torch.float32)


def test_casting_to_bfloat16_keeps_rope_frequencies_in_float32(drafter) -> None:
    copied = copy.deepcopy(drafter).to(torch.bfloat16)
    assert copied.fc.weight.dtype == torch.bfloat16
    assert copied.rotary.inv_freq.dtype == torch.float32
    assert torch.equal(copied.rotary.inv_freq, drafter.rotary.inv_freq)


def test_draft_never_syncs_with_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the meta device any .item()/.tolist()/bool(tensor) raises: the inference path
    (append_context + draft) must run there end to end, batch rows of different lengths.
    (The CPU attention reference reads its key count from the tensors; the GPU kernel
    sizes its grid from the static bound, which the reference is given here.)"""
    reference = tree_attention.tree_attention_reference
    monkeypatch.setattr(tree_attention, "tree_attention_reference",
                        functools.partial(reference, length=32))
    config = DrafterConfig.from_hf(ZLAB_CONFIG)
    with torch.device("meta"):
        drafter, embeddings = DFlashDrafter(config).fuse_weights(), TargetEmbeddings(V, H, False)
        pool, slots, lens = drafter.new_pool(3, 32), torch.tensor([2, 0]), torch.tensor([3, 7])
        fused = drafter.fuse(torch.randn(2, 4, len(LAYER_IDS) * H))
        drafter.append_context(pool, slots, lens, fused)
        logits = drafter.draft(pool, slots, lens + 4, torch.tensor([1, 2]), embeddings)
    assert logits.shape == (2, BLOCK - 1, V) and logits.is_meta


UNSUPPORTED = {
    "no block_size": (lambda c: {k: v for k, v in c.items() if k != "block_size"},
                      "no block_size"),
    "two block sizes": (lambda c: c | {"dflash_config": {"block_size": 16, "mask_token_id": 1}},
                        "block_size 6 != dflash_config.block_size 16"),
    "yarn": (lambda c: c | {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
    "gelu": (lambda c: c | {"hidden_act": "gelu"}, "gelu"),
    "no hidden_size": (lambda c: c | {"hidden_size": None}, "hidden_size"),
    "heads": (lambda c: c | {"num_key_value_heads": 3}, "not a multiple"),
}


@pytest.mark.parametrize("case", list(UNSUPPORTED))
def test_configs_we_do_not_implement_raise_checkpoint_error(case: str) -> None:
    edit, message = UNSUPPORTED[case]
    with pytest.raises(CheckpointError, match=message):
        DrafterConfig.from_hf(edit(copy.deepcopy(ZLAB_CONFIG)))
