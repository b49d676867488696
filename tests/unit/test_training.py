"""The drafter training recipe: anchors, block mask, loss weights, prompt sources, response
shards, and `ddtree train-drafter` end to end on a tiny target (CPU, seconds)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from ddtree.cli import main
from ddtree.models.checkpoint import read_config
from ddtree.models.drafter import load_drafter
from ddtree.models.target import load_target, load_target_embeddings
from ddtree.models.target_config import TargetConfig
from ddtree.models.tiny import build_tokenizer, make_tiny_pair
from ddtree.training.data import (
    IGNORE_INDEX,
    SequenceStore,
    loss_gamma,
    make_batch,
    position_weights,
    sample_anchors,
)
from ddtree.training.loss import TargetFeatures
from ddtree.training.prompts import PromptConfig, build_prompts, encode_prompts
from ddtree.training.responses import (
    ResponseConfig,
    completed_shards,
    generate_responses,
    load_generator_model,
    pack_sequences,
    shard_path,
)
from ddtree.training.trainer import lr_factor

SPEC_BENCH = Path(__file__).resolve().parents[3] / "shared" / "prompts" / "spec_bench"


def random_sequences(num: int, seed: int) -> list[tuple[torch.Tensor, int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(num):
        length = int(torch.randint(12, 40, (1,), generator=g))
        prompt_len = int(torch.randint(1, length - 2, (1,), generator=g))
        out.append((torch.randint(0, 50, (length,), generator=g), prompt_len))
    return out


def test_anchors_lie_in_the_response_and_leave_room_for_a_label() -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        anchors = sample_anchors(prompt_len=5, seq_len=20, num_anchors=6, generator=g)
        assert len(anchors) == 6 and len(set(anchors.tolist())) == 6
        assert anchors.min() >= 5 and anchors.max() <= 18
    assert sample_anchors(5, 7, 10, g).tolist() == [5]  # only one anchor fits
    assert len(sample_anchors(5, 6, 10, g)) == 0  # a 1-token response opens no block


def test_block_mask_sees_context_before_its_anchor_and_only_its_own_block() -> None:
    b, n = 4, 5
    sequences = random_sequences(6, seed=1)
    batch = make_batch(sequences, b, n, torch.Generator().manual_seed(2))
    seq_len = batch.input_ids.shape[1]
    assert batch.visible.shape == (6, n * b, seq_len + n * b)
    for row, (ids, _) in enumerate(sequences):
        for j in range(n):
            anchor = int(batch.anchors[row, j])
            real = bool(batch.weights[row, j, 0] > 0)
            for q in range(j * b, (j + 1) * b):
                ctx = batch.visible[row, q, :seq_len]
                expected = (torch.arange(seq_len) < anchor) & real
                assert torch.equal(ctx, expected), (row, j, q)
                blocks = batch.visible[row, q, seq_len:].view(n, b)
                assert blocks[j].all() and blocks.sum() == b  # own block, both directions
            if real:
                assert int(batch.bonus[row, j]) == int(ids[anchor])
                assert batch.block_positions[row, j * b:(j + 1) * b].tolist() == list(
                    range(anchor, anchor + b))


def test_labels_are_the_tokens_after_the_anchor_and_padding_is_ignored() -> None:
    b = 6
    sequences = random_sequences(4, seed=3)
    batch = make_batch(sequences, b, 8, torch.Generator().manual_seed(4))
    for row, (ids, _) in enumerate(sequences):
        for j in range(8):
            anchor = int(batch.anchors[row, j])
            real = bool(batch.weights[row, j, 0] > 0)
            for k in range(1, b):
                label = int(batch.labels[row, j, k - 1])
                weight = float(batch.weights[row, j, k - 1])
                if real and anchor + k < len(ids):
                    assert label == int(ids[anchor + k])
                    assert weight == pytest.approx(math.exp(-(k - 1) / loss_gamma(b)))
                else:
                    assert label == IGNORE_INDEX and weight == 0.0


def test_loss_weights_follow_the_dflash_gammas() -> None:
    assert (loss_gamma(16), loss_gamma(10), loss_gamma(8)) == (7.0, 5.0, 4.0)
    assert 5.0 < loss_gamma(12) < 7.0 and loss_gamma(4) < 4.0 < 7.0 < loss_gamma(20)
    weights = position_weights(16)
    assert weights.shape == (15,) and weights[0] == 1.0
    assert torch.allclose(weights, torch.exp(-torch.arange(15.0) / 7.0))


def test_lr_warms_up_then_decays_to_zero() -> None:
    assert lr_factor(0.02, 0.04) == pytest.approx(0.5)
    assert lr_factor(0.04, 0.04) == pytest.approx(1.0)
    assert lr_factor(0.52, 0.04) == pytest.approx(0.5)
    assert lr_factor(1.0, 0.04) == pytest.approx(0.0, abs=1e-9)


def test_training_blocks_match_inference_drafting(tmp_path: Path) -> None:
    """forward_blocks under our block mask = draft() after append_context, per block."""
    target_dir, drafter_dir = make_tiny_pair(tmp_path)
    embeddings = load_target_embeddings(target_dir, "cpu", torch.float32)
    drafter = load_drafter(drafter_dir, TargetConfig.from_hf(read_config(target_dir)), "cpu",
                           torch.float32)
    b, hidden = drafter.config.block_size, drafter.config.hidden_size
    sequences = random_sequences(2, seed=5)
    batch = make_batch(sequences, b, 3, torch.Generator().manual_seed(6))
    seq_len = batch.input_ids.shape[1]
    fused = torch.randn(2, seq_len, hidden, generator=torch.Generator().manual_seed(7))
    positions = torch.arange(seq_len).expand(2, -1)
    with torch.no_grad():
        block = drafter.block_embeddings(batch.bonus, embeddings, b)
        out = drafter.forward_blocks(fused, positions, block, batch.block_positions,
                                     batch.visible)
        logits = embeddings.logits(out).view(2, 3, b, -1)[:, :, 1:]
        for row in range(2):
            for j in range(3):
                anchor = int(batch.anchors[row, j])
                if batch.weights[row, j, 0] == 0:
                    continue  # a padding block
                pool = drafter.new_pool(1, seq_len + b)
                zero = torch.zeros(1, dtype=torch.long)
                drafter.append_context(pool, zero, zero, fused[row:row + 1, :anchor])
                expected = drafter.draft(pool, zero, torch.tensor([anchor]),
                                         batch.bonus[row, j:j + 1], embeddings)
                torch.testing.assert_close(logits[row, j], expected[0], atol=1e-4, rtol=1e-4)


def test_training_features_equal_the_serving_targets_features(tmp_path: Path) -> None:
    """The transformers features the drafter trains on are what TargetModel serves it
    (hidden_states[l + 1]: an off-by-one here silently ruins acceptance)."""
    target_dir, _ = make_tiny_pair(tmp_path)
    ids = torch.randint(0, 300, (2, 9), generator=torch.Generator().manual_seed(8))
    layer_ids = (0, 2, 3)
    features = TargetFeatures(target_dir, layer_ids, torch.device("cpu"), torch.float32)(ids)
    target = load_target(target_dir, "cpu", torch.float32)
    with torch.no_grad():
        served = target.causal(ids, feature_layers=layer_ids).features
    torch.testing.assert_close(features, served, atol=1e-4, rtol=1e-4)


def spec_bench_markers() -> set[str]:
    """First lines of every spec-bench prompt (minus HumanEval's shared boilerplate line)
    and every `def` line of its code prompts."""
    markers = set()
    for path in sorted(SPEC_BENCH.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            for turn in json.loads(line)["turns"]:
                lines = [x.strip() for x in turn.strip().splitlines() if x.strip()]
                first = lines[0].removeprefix("Complete the code I provided.").strip()
                markers.update(x for x in [first] + [x for x in lines if x.startswith("def ")]
                               if len(x) >= 12)
    return markers


@pytest.mark.skipif(not SPEC_BENCH.is_dir(), reason="spec-bench prompts not present")
def test_prompt_sources_contain_no_benchmark_prompt() -> None:
    prompts = build_prompts(PromptConfig(num_prompts=3000, seed=0))
    text = "\n".join(p.text for p in prompts)
    markers = spec_bench_markers()
    assert len(markers) > 400
    assert [m for m in markers if m in text] == []
    assert "human_eval" not in text and "HumanEval" not in text


def test_prompts_are_deterministic_deduplicated_and_capped() -> None:
    config = PromptConfig(num_prompts=600, seed=3, max_chars=900)
    first, again = build_prompts(config), build_prompts(config)
    assert [p.text for p in first] == [p.text for p in again]
    assert len(first) == 600 and len({p.text for p in first}) == 600
    assert max(len(p.text) for p in first) <= 900
    assert {"implement", "code", "chat", "module", "docs"} <= {p.source for p in first}
    other = build_prompts(PromptConfig(num_prompts=600, seed=4, max_chars=900))
    assert [p.text for p in other] != [p.text for p in first]


def test_long_docstrings_become_prose_prompts_to_summarise_or_question(tmp_path) -> None:
    """Without installed docs, function docstrings still feed the prose pool."""
    import random

    from ddtree.training.prompts import source_pools

    doc = ("Return the running total of the values seen so far, so that a caller can\n"
           "stop early when the total passes a limit. The values are read lazily from\n"
           "the iterable, which may be infinite, and nothing is stored besides the sum.\n"
           "This keeps memory use constant however long the input turns out to be.")
    source = f'def running_total(values, limit):\n    """{doc}"""\n    return 0\n'
    (tmp_path / "totals.py").write_text(source)
    pools = source_pools([tmp_path / "totals.py"], PromptConfig(num_prompts=10),
                         random.Random(0))
    assert len(pools["docs"]) == 1 and " ".join(doc.split()) in pools["docs"][0].text


def test_chat_prompts_are_encoded_in_the_targets_chat_template() -> None:
    tokenizer = build_tokenizer()
    prompts = [p for p in build_prompts(PromptConfig(num_prompts=200, seed=1)) if p.chat][:5]
    encoded = encode_prompts(prompts, tokenizer, 10_000)
    assert len(encoded) == len(prompts)
    for ids in encoded:
        text = tokenizer.decode(ids)
        assert text.startswith("<|im_start|>user\n")
        assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert encode_prompts(prompts, tokenizer, max_prompt_tokens=3) == []


def test_response_shards_round_trip_through_the_sequence_store(tmp_path: Path) -> None:
    sequences = [(0, [5, 6, 7], [8, 9, 2], 0.0), (1, [5], [2], 0.8), (2, [1, 2], [3, 4], 0.0)]
    path = shard_path(tmp_path, 0)
    path.parent.mkdir(parents=True)
    torch.save(pack_sequences(sequences), path)
    store = SequenceStore.load(completed_shards(tmp_path))
    assert len(store) == 2  # the 1-token response opens no block
    assert store.get(0)[0].tolist() == [5, 6, 7, 8, 9, 2] and store.get(0)[1] == 3
    assert store.get(1)[0].tolist() == [1, 2, 3, 4] and store.num_response_tokens() == 5


def test_generation_stops_at_end_of_turn_and_resumes_by_shard(tmp_path: Path) -> None:
    target_dir, _ = make_tiny_pair(tmp_path)
    model = load_generator_model(target_dir, torch.device("cpu"), torch.float32)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14], [15, 16], [17, 18, 19]]
    config = ResponseConfig(max_new_tokens=6, batch_size=2, shard_size=4, sample_fraction=0.5)
    stop = int(read_config(target_dir)["eos_token_id"])
    shards = generate_responses(model, prompts, tmp_path / "work", config, [stop], 0, False)
    assert [p.name for p in shards] == ["shard-00000.pt", "shard-00001.pt"]
    store = SequenceStore.load(shards, min_response=0)
    assert sorted(store.get(i)[0][:store.get(i)[1]].tolist() for i in range(6)) == sorted(prompts)
    for i in range(6):
        ids, prompt_len = store.get(i)
        response = ids[prompt_len:].tolist()
        assert 1 <= len(response) <= 6 and stop not in response[:-1]
    stamps = [p.stat().st_mtime_ns for p in shards]
    generate_responses(model, prompts, tmp_path / "work", config, [stop], 0, False)
    assert [p.stat().st_mtime_ns for p in shards] == stamps


def repetitive_shard(work_dir: Path, vocab: int) -> None:
    """Prompts of random tokens answered by repeating their first few tokens: easy for a
    drafter that sees the target's features, so its loss must fall within a few steps."""
    g = torch.Generator().manual_seed(0)
    sequences = []
    for i in range(48):
        prompt = torch.randint(4, vocab, (6,), generator=g).tolist()
        period = int(torch.randint(2, 4, (1,), generator=g))
        sequences.append((i, prompt, [prompt[j % period] for j in range(30)] + [2], 0.0))
    path = shard_path(work_dir, 0)
    path.parent.mkdir(parents=True)
    torch.save(pack_sequences(sequences), path)


def test_train_drafter_cli_writes_a_loadable_drafter_and_loss_falls(tmp_path: Path,
                                                                    capsys) -> None:  # noqa: ANN001
    target_dir, _ = make_tiny_pair(tmp_path)
    work, out = tmp_path / "work", tmp_path / "drafter-out"
    repetitive_shard(work, int(read_config(target_dir)["vocab_size"]))
    argv = ["train-drafter", "--target", str(target_dir), "--out", str(out), "--work-dir",
            str(work), "--stage", "train", "--device", "cpu", "--quiet", "--num-layers", "1",
            "--intermediate-size", "64", "--target-layer-ids", "1,3", "--block-size", "8",
            "--num-anchors", "6", "--batch-size", "8", "--lr", "3e-3", "--max-steps", "30",
            "--log-every", "1", "--save-every", "10"]
    assert main(argv) == 0
    assert "drafter written" in capsys.readouterr().out
    drafter = load_drafter(out, TargetConfig.from_hf(read_config(target_dir)), "cpu",
                           torch.bfloat16)
    assert drafter.config.target_layer_ids == (1, 3) and drafter.mask_embedding is not None
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    records = [json.loads(line) for line in (work / "train" / "log.jsonl").open()]
    losses = [r["loss"] for r in records if "eval" not in r]
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    stats = json.loads((work / "train" / "stats.json").read_text())
    assert stats["steps"] == 30 and stats["eval"]["num_sequences"] >= 1
    # --resume from the final state runs no further step and keeps the log
    assert main(argv + ["--resume"]) == 0
    assert len((work / "train" / "log.jsonl").read_text().splitlines()) == len(records)
