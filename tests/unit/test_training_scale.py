"""Drafter training at scale: engine-generated responses (greedy-exact, resumable, cut at a
time budget), token packs under the device's file limit, sharded checkpoints, growing a
drafter from a smaller checkpoint, held-out acceptance, early stopping, resume and the KL
loss (CPU, tiny models, seconds)."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ddtree.models.checkpoint import INDEX_NAME, SINGLE_NAME, read_config
from ddtree.models.drafter import DFlashDrafter, load_drafter, save_drafter
from ddtree.models.target import load_target, load_target_embeddings
from ddtree.models.target_config import TargetConfig
from ddtree.models.tiny import make_tiny_pair
from ddtree.training import shards
from ddtree.training.data import SequenceStore, make_batch
from ddtree.training.drafter_init import grow_into, read_drafter_state
from ddtree.training.engine_responses import EngineGenConfig, generate_with_engine
from ddtree.training.evaluation import (
    chain_acceptance,
    sampled_chain_lower_bound,
    tree_acceptance,
)
from ddtree.training.loss import block_loss
from ddtree.training.responses import completed_shards
from ddtree.training.trainer import TrainConfig, Trainer

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14], [15, 16], [17, 18, 19], [20, 21, 22]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_tiny_pair(tmp_path_factory.mktemp("pair"))


def greedy_reference(target_dir: Path, prompt: list[int], max_new: int,
                     stops: set[int]) -> list[int]:
    """Plain greedy decoding by full recomputation: the definition the engine must meet."""
    target = load_target(target_dir, "cpu", torch.float32)
    ids, out = torch.tensor([prompt]), []
    with torch.no_grad():
        for _ in range(max_new):
            token = int(target.causal(ids).logits[0, -1].argmax())
            out.append(token)
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
            if token in stops:
                break
    return out


def responses_by_prompt(work_dir: Path) -> dict[tuple[int, ...], list[int]]:
    store = SequenceStore.load(completed_shards(work_dir), min_response=0)
    out = {}
    for i in range(len(store)):
        ids, prompt_len = store.get(i)
        out[tuple(ids[:prompt_len].tolist())] = ids[prompt_len:].tolist()
    return out


def test_engine_generator_equals_greedy_ar_keeps_the_stop_token_and_resumes(
        pair: tuple[Path, Path], tmp_path: Path) -> None:
    target_dir, _ = pair
    target = load_target(target_dir, "cpu", torch.float32)
    stops = {285, 14}  # tokens these prompts' greedy answers reach within 12 steps
    config = EngineGenConfig(max_new_tokens=12, max_num_seqs=3, sample_fraction=0.0,
                             shard_tokens=20, cuda_graphs=False)
    stats = generate_with_engine(target, PROMPTS, tmp_path, config, sorted(stops))
    assert stats["num_sequences"] == len(PROMPTS) and len(stats["shards"]) >= 2
    got = responses_by_prompt(tmp_path)
    ended = 0
    for prompt in PROMPTS:
        expected = greedy_reference(target_dir, prompt, 12, stops)
        assert got[tuple(prompt)] == expected, prompt
        ended += expected[-1] in stops
    assert ended >= 2 and stats["num_ended"] == ended
    again = generate_with_engine(target, PROMPTS, tmp_path, config, sorted(stops))
    assert again["num_sequences"] == 0 and again["num_prompts_done_before"] == len(PROMPTS)


def test_engine_generator_cuts_rows_at_the_time_budget_and_keeps_their_prefix(
        pair: tuple[Path, Path], tmp_path: Path) -> None:
    target_dir, _ = pair
    target = load_target(target_dir, "cpu", torch.float32)
    ticks = itertools.count()
    config = EngineGenConfig(max_new_tokens=30, max_num_seqs=2, sample_fraction=0.0,
                             cuda_graphs=False, max_seconds=8)
    stats = generate_with_engine(target, PROMPTS, tmp_path, config, [],
                                 clock=lambda: float(next(ticks)))
    assert stats["num_cut"] == 2 and stats["num_prompts_left"] > 0
    for prompt, response in responses_by_prompt(tmp_path).items():
        assert 2 <= len(response) < 30
        assert response == greedy_reference(target_dir, list(prompt), len(response), set())


def random_shards(work_dir: Path, num: int, seed: int) -> list[tuple[list[int], list[int]]]:
    rng = np.random.default_rng(seed)
    written = []
    for s in range(num):
        sequences = []
        for i in range(20):
            prompt = rng.integers(0, 60_000, 8).tolist()
            response = rng.integers(0, 60_000, int(rng.integers(3, 40))).tolist()
            sequences.append((s * 100 + i, prompt, response, 0.0, True))
            written.append((prompt, response))
        shards.write_shard(shards.next_shard_path(work_dir),
                           shards.pack(sequences, "d", vocab_size=49_152))
    return written


def test_token_packs_stay_under_the_file_limit_and_load_back(tmp_path: Path) -> None:
    written = random_shards(tmp_path / "work", 6, seed=0)
    assert shards.read_shard(shards.shard_files(tmp_path / "work")[0])["tokens"].dtype == np.uint16
    size = max(p.stat().st_size for p in shards.shard_files(tmp_path / "work"))
    limit = int(size * 2.5)  # two shards per pack
    report = shards.export_packs(tmp_path / "work", tmp_path / "out", max_files=2,
                                 max_bytes=limit)
    assert len(report["files"]) == 2 and report["shards_left_behind"] == 2
    assert all((tmp_path / "out" / n).stat().st_size <= limit for n in report["files"])
    shards.import_packs(tmp_path / "out", tmp_path / "next")
    store = SequenceStore.load(completed_shards(tmp_path / "next"), min_response=0)
    loaded = [(store.get(i)[0][:8].tolist(), store.get(i)[0][8:].tolist())
              for i in range(len(store))]
    assert loaded == written[:80]
    assert shards.done_prompts(tmp_path / "next", "d") == {s * 100 + i for s in range(4)
                                                           for i in range(20)}


def test_sharded_checkpoint_round_trips_under_the_file_limit(pair: tuple[Path, Path],
                                                            tmp_path: Path) -> None:
    target_dir, drafter_dir = pair
    target_config = TargetConfig.from_hf(read_config(target_dir))
    drafter = load_drafter(drafter_dir, target_config, "cpu", torch.float32)
    limit = 40_000
    files = save_drafter(drafter, tmp_path / "d", max_shard_bytes=limit)
    weight_files = sorted(p.name for p in files if p.suffix == ".safetensors")
    num = len(weight_files)
    assert num >= 3 and weight_files[0] == f"model-00001-of-{num:05d}.safetensors"
    assert all((tmp_path / "d" / n).stat().st_size <= limit for n in weight_files)
    index = json.loads((tmp_path / "d" / INDEX_NAME).read_text())
    assert set(index["weight_map"].values()) == set(weight_files)
    again = load_drafter(tmp_path / "d", target_config, "cpu", torch.float32)
    for name, value in drafter.state_dict().items():
        torch.testing.assert_close(again.state_dict()[name], value, rtol=0, atol=0)
    save_drafter(drafter, tmp_path / "d")  # fits one file: the shards and index go
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["config.json", SINGLE_NAME]


def test_a_grown_drafter_drafts_exactly_like_its_checkpoint(pair: tuple[Path, Path]) -> None:
    _, drafter_dir = pair
    old_config, tensors = read_drafter_state(drafter_dir)
    old = DFlashDrafter(old_config)
    old.load_state_dict(tensors)
    new_config = dataclasses.replace(
        old_config, num_hidden_layers=old_config.num_hidden_layers + 2,
        intermediate_size=old_config.intermediate_size + 48, target_layer_ids=(0, 1, 2, 3))
    new = DFlashDrafter(new_config)
    for p in new.parameters():
        torch.nn.init.normal_(p, std=0.5, generator=torch.Generator().manual_seed(3))
    grow_into(new, old_config, tensors)
    g = torch.Generator().manual_seed(4)
    hidden = old_config.hidden_size
    per_layer = torch.randn(2, 10, 4, hidden, generator=g)  # (B, S, target layer, H)
    block = torch.randn(2, 8, hidden, generator=g)
    positions = torch.arange(10).expand(2, -1)
    block_positions = (torch.arange(8) + 4).expand(2, -1)
    visible = torch.rand(2, 8, 18, generator=g) < 0.7
    visible[:, :, 10:] = True
    with torch.no_grad():
        want = old.forward_blocks(old.fuse(per_layer[:, :, [1, 2]].flatten(2)), positions,
                                  block, block_positions, visible)
        got = new.forward_blocks(new.fuse(per_layer.flatten(2)), positions, block,
                                 block_positions, visible)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(Exception, match="fewer layers"):
        grow_into(DFlashDrafter(dataclasses.replace(old_config, num_hidden_layers=1)),
                  old_config, tensors)


def test_tree_and_sampled_acceptance_on_hand_made_blocks() -> None:
    vocab, depth = 6, 3
    logits = torch.full((2, depth, vocab), -10.0)
    logits[:, :, 1] = 5.0  # rank 0 everywhere: token 1
    logits[:, :, 2] = 4.0  # rank 1: token 2
    labels = torch.tensor([[1, 1, 1], [2, 1, 5]])
    bonus = torch.zeros(2, dtype=torch.long)
    chain = chain_acceptance(logits.argmax(-1) == labels, torch.ones(2, depth, dtype=torch.bool))
    assert chain.tolist() == [4.0, 1.0]
    assert tree_acceptance(logits, bonus, labels, budget=3).tolist() == [4.0, 1.0]
    assert tree_acceptance(logits, bonus, labels, budget=8).tolist() == [4.0, 3.0]
    drafts = logits.argmax(-1)
    probs = torch.tensor([[1.0, 0.5, 0.5], [0.5, 0.5, 0.5]])
    keep = torch.ones(2, depth, dtype=torch.bool)
    bound = sampled_chain_lower_bound(drafts, probs, labels, keep)
    # row 0: 1 + 1 + 0.5 + 0.25; row 1: d_1 misses the label, so only position 1 counts
    assert bound.tolist() == [2.75, 1.5]


def repetitive_store(vocab: int, num: int = 48) -> SequenceStore:
    g = torch.Generator().manual_seed(0)
    sequences = []
    for i in range(num):
        prompt = torch.randint(4, vocab, (6,), generator=g).tolist()
        period = int(torch.randint(2, 4, (1,), generator=g))
        sequences.append((i, prompt, [prompt[j % period] for j in range(30)] + [2], 0.0, True))
    return _store(sequences, vocab)


def _store(sequences: list, vocab: int) -> SequenceStore:
    arrays = shards.pack(sequences, "r", vocab)
    flat = torch.from_numpy(arrays["tokens"].astype(np.int32))
    offsets = torch.from_numpy(arrays["offsets"])
    return SequenceStore(flat, offsets[:-1], offsets.diff(),
                         torch.from_numpy(arrays["prompt_lens"].astype(np.int64)))


def small_config(**changes: object) -> TrainConfig:
    base = TrainConfig(num_layers=1, intermediate_size=64, target_layer_ids=(1, 3),
                       block_size=8, num_anchors=6, batch_size=8, lr=3e-3, max_steps=8,
                       log_every=1, save_every=4, eval_fraction=0.2, eval_tree_budget=8)
    return dataclasses.replace(base, **changes)


def test_training_resumes_from_the_saved_step(pair: tuple[Path, Path], tmp_path: Path) -> None:
    target_dir, _ = pair
    store = repetitive_store(int(read_config(target_dir)["vocab_size"]))
    cpu = torch.device("cpu")
    first = Trainer(target_dir, store, tmp_path, small_config(max_steps=4), cpu)
    assert first.fit(resume=False, progress=False).step == 4
    saved = {k: v.clone() for k, v in first.drafter.state_dict().items()}
    second = Trainer(target_dir, store, tmp_path, small_config(max_steps=8), cpu)
    assert second.load_state() and second.progress.step == 4
    for name, value in saved.items():
        torch.testing.assert_close(second.drafter.state_dict()[name], value)
    run = second.fit(resume=True, progress=False)
    assert run.step == 8
    steps = [json.loads(line)["step"] for line in (tmp_path / "train" / "log.jsonl").open()
             if "eval" not in json.loads(line)]
    assert steps == list(range(1, 9))


def test_training_stops_early_when_held_out_acceptance_is_flat(pair: tuple[Path, Path],
                                                               tmp_path: Path) -> None:
    target_dir, _ = pair
    store = repetitive_store(int(read_config(target_dir)["vocab_size"]))
    config = small_config(lr=0.0, max_steps=100, eval_every=2, patience=2)
    trainer = Trainer(target_dir, store, tmp_path, config, torch.device("cpu"))
    run = trainer.fit(resume=False, progress=False)
    assert run.early_stopped and run.step == 4 and run.best_step == 0  # evals at 0, 2, 4
    evals = [json.loads(line)["eval"] for line in (tmp_path / "train" / "log.jsonl").open()
             if "eval" in json.loads(line)]
    assert len(evals) == 3 and len({e["tau"] for e in evals}) == 1
    assert {"tau", "tau_tree8", "tau_t1_lower", "loss"} <= evals[0].keys()
    assert all(1.0 <= evals[0][k] <= 8.0 for k in ("tau", "tau_tree8", "tau_t1_lower"))


def test_kl_loss_is_zero_against_its_own_logits_and_trains(pair: tuple[Path, Path],
                                                          tmp_path: Path) -> None:
    target_dir, drafter_dir = pair
    target_config = TargetConfig.from_hf(read_config(target_dir))
    embeddings = load_target_embeddings(target_dir, "cpu", torch.float32)
    old_config, tensors = read_drafter_state(drafter_dir)
    drafter = DFlashDrafter(old_config)
    drafter.load_state_dict(tensors)
    store = repetitive_store(target_config.vocab_size, num=4)
    batch = make_batch([store.get(i) for i in range(4)], old_config.block_size, 3,
                       torch.Generator().manual_seed(1))
    features = torch.randn(4, batch.input_ids.shape[1], 2 * old_config.hidden_size)
    with torch.no_grad():
        _, metrics = block_loss(drafter, embeddings, features, batch)
        loss, _ = block_loss(drafter, embeddings, features, batch, metrics["logits"],
                             kl_weight=1.0)
    assert abs(float(loss)) < 1e-5
    trainer = Trainer(target_dir, repetitive_store(target_config.vocab_size), tmp_path,
                      small_config(kl_weight=0.5, max_steps=6), torch.device("cpu"))
    run = trainer.fit(resume=False, progress=False)
    losses = [json.loads(line)["loss"] for line in (tmp_path / "train" / "log.jsonl").open()
              if "eval" not in json.loads(line)]
    assert run.step == 6 and all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_held_out_tree_acceptance_runs_with_a_bfloat16_lm_head(pair: tuple[Path, Path],
                                                               tmp_path: Path) -> None:
    """On a GPU the frozen target pieces are bf16 while the drafter's hidden states of the
    tree evaluation are float32 (outside autocast): the LM head must take them anyway."""
    target_dir, _ = pair
    store = repetitive_store(int(read_config(target_dir)["vocab_size"]))
    trainer = Trainer(target_dir, store, tmp_path, small_config(), torch.device("cpu"))
    batch = make_batch([store.get(i) for i in trainer.eval_sequences()[0][:4]], 8, 6,
                       torch.Generator().manual_seed(0), torch.device("cpu"))
    with torch.no_grad():
        _, metrics, _ = trainer.batch_loss(batch)
        full = trainer._tree_tau(batch, metrics["hidden"], metrics["keep"])
        trainer.embeddings.to(torch.bfloat16)
        half = trainer._tree_tau(batch, metrics["hidden"].float(), metrics["keep"])
    assert half.shape == full.shape and half.numel() > 0 and bool((half >= 1).all())
