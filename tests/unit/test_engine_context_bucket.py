"""EngineConfig.context_bucket: rounds whose rows' keys all fit the bucket run with the
attention sized for it (its own graphs on a GPU), the rest with the pool row's length.
Every attention call's span bounds every query's keys (the kernel's split workspace is
sized from it: the pipelined round's lag and the tree included), both spans are used as contexts
grow, and the tokens are those of the engine without it."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ddtree.engine import Engine, EngineConfig, GenerationRequest, SpecParams
from ddtree.engine.generate import build_engine
from ddtree.models import ops
from ddtree.models.tiny import make_tiny_pair
from ddtree.runtime import load_pair

BUCKET = 64


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    root = tmp_path_factory.mktemp("tiny-bucket")
    make_tiny_pair(root, family="qwen3")
    return load_pair(root / "target", root / "drafter", torch.device("cpu"), torch.float32)


def serve(engine: Engine, specs: list[SpecParams]) -> dict[str, list[int]]:
    gen = torch.Generator().manual_seed(1)
    tokens: dict[str, list[int]] = {}
    for i, spec in enumerate(specs):
        prompt = torch.randint(3, 100, (5 + 4 * i,), generator=gen).tolist()
        engine.add_request(str(i), GenerationRequest(prompt, 70, spec=spec, ignore_eos=True))
        tokens[str(i)] = []
    while engine.has_work:
        for request_id, result in engine.step():
            tokens[request_id] += result.new_tokens
    return tokens


@pytest.mark.parametrize("specs", [
    [SpecParams("ar")] * 3,
    [SpecParams("tree", 8), SpecParams("ar"), SpecParams("linear")],
], ids=["ar", "mixed"])
def test_rounds_use_the_bucket_while_their_keys_fit_it(
        pair: tuple[Any, Any], specs: list[SpecParams], monkeypatch: pytest.MonkeyPatch) -> None:
    target, drafter = pair
    config = EngineConfig(max_num_seqs=3, max_model_len=128, max_budget=8)
    expected = serve(build_engine(target, drafter, config), specs)

    engine = build_engine(target, drafter, EngineConfig(
        max_num_seqs=3, max_model_len=128, max_budget=8, context_bucket=BUCKET))
    assert engine.plan.context_bucket == BUCKET < engine.plan.max_len
    spans: list[int] = []
    attention = ops.attention

    def checked(backend: Any, q: Any, k_cache: Any, v_cache: Any, meta: Any,
                scale: float) -> Any:
        if k_cache.shape[1] == engine.plan.max_len and meta.max_kv_len:  # the target's pool
            keys = (meta.prefix_len + meta.num_tree_keys).max().item()
            assert keys <= meta.max_kv_len, (keys, meta.max_kv_len)
            spans.append(meta.max_kv_len)
        return attention(backend, q, k_cache, v_cache, meta, scale)

    monkeypatch.setattr(ops, "attention", checked)
    assert serve(engine, specs) == expected
    assert BUCKET in spans and engine.plan.max_len in spans  # both spans, as contexts grew
    assert spans.index(engine.plan.max_len) > spans.index(BUCKET)


def test_a_bucket_no_round_could_use_is_off() -> None:
    from ddtree.engine.config import plan_pool
    from ddtree.models.target_config import TargetConfig

    config = TargetConfig.from_hf({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 96,
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 256, "eos_token_id": 0})
    plan = lambda bucket: plan_pool(  # noqa: E731
        EngineConfig(max_budget=16, context_bucket=bucket), config, torch.device("cpu"),
        torch.float32, 0, 3)
    assert plan(0).context_bucket == 0
    assert plan(128).context_bucket == 128
    assert plan(30).context_bucket == 0  # below two trees and the drafter's depth
    assert plan(10_000).context_bucket == 0  # past the row length
