"""Checkpoint reading: single-file and sharded safetensors written by transformers load the
same weights; the drafter-side loader reads only the embedding and LM head; every broken
checkpoint is a CheckpointError that names the problem."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ddtree.errors import CheckpointError
from ddtree.models.checkpoint import read_config, read_tensors, weight_files
from ddtree.models.target import load_target, load_target_embeddings

EMBEDDING_NAMES = {"model.embed_tokens.weight", "lm_head.weight"}


def write_llama(path: Path, tied: bool = False, max_shard_size: str | None = None) -> Path:
    """A tiny random LlamaForCausalLM saved by transformers itself."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=150, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=tied, max_position_embeddings=64)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kwargs)
    return path


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama(tmp_path_factory.mktemp("single"))


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    path = write_llama(tmp_path / "sharded", max_shard_size="20KB")
    assert (path / "model.safetensors.index.json").is_file()
    assert not (path / "model.safetensors").exists()
    return path


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_sharded_checkpoint_loads_the_same_weights_as_a_single_file(single: Path,
                                                                    sharded: Path) -> None:
    assert len(set(weight_files(sharded).values())) > 2
    one = load_target(single, "cpu", torch.float32)
    many = load_target(sharded, "cpu", torch.float32)
    assert same_weights(one, many)


def test_embeddings_loader_reads_only_embedding_and_lm_head(sharded: Path) -> None:
    files = weight_files(sharded)
    needed = {files[name] for name in EMBEDDING_NAMES}
    others = set(files.values()) - needed
    assert others
    for shard in others:
        shard.unlink()  # the embeddings loader must not even open the other shards
    embeddings = load_target_embeddings(sharded, "cpu", torch.float32)
    assert set(embeddings.state_dict()) == {"embed_tokens.weight", "lm_head.weight"}
    assert not any(p.requires_grad for p in embeddings.parameters())
    ids = torch.tensor([[3, 4, 5]])
    assert embeddings.embed(ids).shape == (1, 3, 32)
    assert embeddings.logits(embeddings.embed(ids)).dtype == torch.float32
    with pytest.raises(CheckpointError, match="missing shard"):
        load_target(sharded, "cpu", torch.float32)


def test_embeddings_match_the_full_target(single: Path) -> None:
    target = load_target(single, "cpu", torch.float32)
    embeddings = load_target_embeddings(single, "cpu", torch.float32)
    assert same_weights(target.embeddings, embeddings)


def test_tied_checkpoint_without_lm_head_ties_it_back(tmp_path: Path) -> None:
    path = write_llama(tmp_path / "tied", tied=True)
    assert "lm_head.weight" not in weight_files(path)
    embeddings = load_target_embeddings(path, "cpu", torch.float32)
    assert embeddings.lm_head.weight is embeddings.embed_tokens.weight
    target = load_target(path, "cpu", torch.float32)
    assert target.embeddings.lm_head.weight is target.embeddings.embed_tokens.weight


def test_read_tensors_selects_and_casts(single: Path) -> None:
    tensors = read_tensors(single, "cpu", torch.bfloat16, select=lambda n: n in EMBEDDING_NAMES)
    assert set(tensors) == EMBEDDING_NAMES
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    assert read_config(single)["model_type"] == "llama"


def copy_of(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return dst


def test_missing_directory_is_a_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_target(tmp_path / "nowhere", "cpu", torch.float32)


def test_missing_config_is_a_checkpoint_error(single: Path, tmp_path: Path) -> None:
    path = copy_of(single, tmp_path)
    (path / "config.json").unlink()
    with pytest.raises(CheckpointError, match="missing config.json"):
        load_target(path, "cpu", torch.float32)


def test_bad_json_config_is_a_checkpoint_error(single: Path, tmp_path: Path) -> None:
    path = copy_of(single, tmp_path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json"):
        load_target(path, "cpu", torch.float32)


def test_truncated_safetensors_is_a_checkpoint_error(single: Path, tmp_path: Path) -> None:
    path = copy_of(single, tmp_path)
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="corrupt safetensors file .*model.safetensors"):
        load_target(path, "cpu", torch.float32)


def test_missing_shard_is_a_checkpoint_error(sharded: Path) -> None:
    shard = weight_files(sharded)["model.norm.weight"]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"missing shard {shard.name}"):
        load_target(sharded, "cpu", torch.float32)


def test_shard_outside_the_checkpoint_is_refused(sharded: Path) -> None:
    index_file = sharded / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    index["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors"
    index_file.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="invalid shard"):
        load_target(sharded, "cpu", torch.float32)


def test_no_safetensors_is_a_checkpoint_error(single: Path, tmp_path: Path) -> None:
    path = copy_of(single, tmp_path)
    (path / "model.safetensors").rename(path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="only safetensors"):
        load_target(path, "cpu", torch.float32)


def rewrite_weights(path: Path, edit) -> None:
    weights = path / "model.safetensors"
    tensors = load_file(weights)
    edit(tensors)
    save_file(tensors, weights, metadata={"format": "pt"})


def test_missing_tensor_is_a_checkpoint_error(single: Path, tmp_path: Path) -> None:
    path = copy_of(single, tmp_path)
    rewrite_weights(path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match="model.layers.1.mlp.up_proj.weight"):
        load_target(path, "cpu", torch.float32)


def test_untied_checkpoint_without_lm_head_is_a_checkpoint_error(single: Path,
                                                                 tmp_path: Path) -> None:
    path = copy_of(single, tmp_path)
    rewrite_weights(path, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(CheckpointError, match="lm_head.weight"):
        load_target_embeddings(path, "cpu", torch.float32)


def test_unexpected_tensor_is_a_checkpoint_error(single: Path, tmp_path: Path) -> None:
    path = copy_of(single, tmp_path)
    rewrite_weights(path, lambda t: t.update({"model.layers.2.extra.weight": torch.ones(2)}))
    with pytest.raises(CheckpointError, match="unexpected.*model.layers.2.extra.weight"):
        load_target(path, "cpu", torch.float32)


def test_shape_mismatch_is_a_checkpoint_error(single: Path, tmp_path: Path) -> None:
    path = copy_of(single, tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["intermediate_size"] = 48
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="shape"):
        load_target(path, "cpu", torch.float32)


def test_unsupported_model_type_is_a_checkpoint_error(single: Path, tmp_path: Path) -> None:
    path = copy_of(single, tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["model_type"] = "mamba"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="unsupported model_type 'mamba'"):
        load_target(path, "cpu", torch.float32)
