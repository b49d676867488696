"""A tensor-parallel target over real processes (gloo on the CPU, float32), TP 2 on both
demo-shaped tiny families: the sharded forward equals the unsharded one within float32
tolerance, and whole generations at T=0 (alone and batched) serve exactly the TP-1 tokens
in ar and tree mode. Launch errors and TP 4: test_tensor_parallel_launch.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from ddtree.engine import GenerationRequest, SpecParams, generate
from ddtree.engine.generate import build_engine
from ddtree.models.target import TargetModel, load_target
from ddtree.models.tiny import make_tiny_pair
from ddtree.runtime import load_pair
from ddtree.tp_launch import Group, GroupSpec, start_group

MAX_TOKENS = 16


def start(target_dir: Path, world_size: int, deaths: list[int] | None = None) -> Group:
    def on_death(rank: int, code: int | None) -> None:
        if deaths is not None:
            deaths.append(rank)

    return start_group(GroupSpec(str(target_dir), torch.float32, ("cpu",) * world_size),
                       on_death)


def leader(group: Group) -> TargetModel:
    assert group.target is not None
    return group.target


@pytest.fixture(scope="module", params=("llama", "qwen3"))
def tp2(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[tuple[Path, Group]]:
    root = tmp_path_factory.mktemp(f"tp-{request.param}")
    make_tiny_pair(root, family=request.param)
    group = start(root / "target", 2)
    yield root, group
    group.stop()


def prompt_ids(vocab_size: int, lengths: tuple[int, ...]) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab_size, (n,), generator=gen).tolist() for n in lengths]


def tokens_of(target: TargetModel, drafter, prompt: list[int], spec: SpecParams) -> list[int]:
    request = GenerationRequest(prompt, MAX_TOKENS, spec=spec, ignore_eos=True)
    return [t for result, _ in generate(target, drafter, request) for t in result.new_tokens]


@torch.inference_mode()
def assert_sharded_forward_matches(full: TargetModel, sharded: TargetModel) -> None:
    ids = torch.tensor(prompt_ids(full.config.vocab_size, (12, 12)))  # (B, M)
    expected, got = full.causal(ids, (0, 1)), sharded.causal(ids, (0, 1))
    torch.testing.assert_close(got.logits, expected.logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.features, expected.features, rtol=1e-4, atol=1e-4)
    assert torch.equal(got.logits.argmax(-1), expected.logits.argmax(-1))


def test_tp2_forward_logits_equal_the_unsharded_target(tp2) -> None:
    root, group = tp2
    full = load_target(root / "target", "cpu", torch.float32)
    assert_sharded_forward_matches(full, leader(group))
    attn = leader(group).layers[0].self_attn  # type: ignore[union-attr]
    assert (attn.num_heads, attn.num_kv_heads) == (2, 1)  # half of 4 query / 2 KV heads
    assert leader(group).new_pool(2, 8).k.shape[3] == 1  # the pool holds this rank's heads


def test_tp2_generation_at_t0_serves_the_tp1_tokens_in_ar_and_tree(tp2) -> None:
    root, group = tp2
    target, drafter = load_pair(root / "target", root / "drafter", torch.device("cpu"),
                                torch.float32)
    assert drafter is not None
    for prompt in prompt_ids(target.config.vocab_size, (5, 1)):
        reference = tokens_of(target, drafter, prompt, SpecParams("ar"))
        for spec in (SpecParams("ar"), SpecParams("tree", 16)):
            assert tokens_of(leader(group), drafter, prompt, spec) == reference, spec


def test_tp2_batched_engine_serves_the_tp1_tokens(tp2) -> None:
    root, group = tp2
    target, drafter = load_pair(root / "target", root / "drafter", torch.device("cpu"),
                                torch.float32)
    prompts = prompt_ids(target.config.vocab_size, (7, 3, 10))
    results: dict[str, list[int]] = {}
    engine = build_engine(leader(group), drafter)
    for index, prompt in enumerate(prompts):
        mode = SpecParams("tree", 8) if index % 2 else SpecParams("ar")
        engine.add_request(str(index), GenerationRequest(prompt, MAX_TOKENS, spec=mode,
                                                         ignore_eos=True))
        results[str(index)] = []
    while engine.has_work:
        for request_id, result in engine.step():
            results[request_id] += result.new_tokens
    for index, prompt in enumerate(prompts):
        assert results[str(index)] == tokens_of(target, drafter, prompt, SpecParams("ar"))
