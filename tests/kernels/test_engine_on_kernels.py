"""The whole engine on the Triton kernels (the interpreter without a GPU): a batch of mixed
modes, greedy and seeded sampling, serves the same tokens as on the PyTorch references,
and every mode serves the ar tokens."""

from __future__ import annotations

import pytest
import torch

from ddtree.engine import Engine, EngineConfig, GenerationRequest, SpecParams
from ddtree.engine.config import plan_pool
from ddtree.engine.drafting import LocalDrafter
from ddtree.kernels import matmul
from ddtree.models.drafter import DFlashDrafter, DrafterConfig
from ddtree.models.meta import context_meta
from ddtree.models.ops import Backend
from ddtree.models.target import TargetModel
from ddtree.models.target_config import TargetConfig
from ddtree.sampling import SamplingParams

PROMPT = [5, 6, 7, 8, 9, 10]


def make_pair(family: str) -> tuple[TargetModel, DFlashDrafter]:
    """A small pair with the kernels' head dim (64): a Qwen3-style target (head norms) or a
    Llama-style one (none: its QKV GEMM may take RoPE as its epilogue)."""
    torch.manual_seed(0)
    architecture = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}[family]
    target = TargetModel(TargetConfig.from_hf({
        "model_type": family, "architectures": [architecture], "vocab_size": 96,
        "hidden_size": 128, "intermediate_size": 192, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 256, "eos_token_id": 0}))
    drafter = DFlashDrafter(DrafterConfig(
        hidden_size=128, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        head_dim=64, intermediate_size=128, vocab_size=96, block_size=4, num_target_layers=2,
        target_layer_ids=(0, 1), has_mask_embedding=True))
    for module in (target, drafter):
        for name, param in module.named_parameters():
            torch.nn.init.normal_(param, std=0.3)
            if "norm" in name:
                param.data = 1 + param.data / 3
    return (target.eval().requires_grad_(False).fuse_weights(),
            drafter.eval().requires_grad_(False).fuse_weights())


@pytest.fixture(scope="module")
def pair() -> tuple[TargetModel, DFlashDrafter]:
    return make_pair("qwen3")


def serve(pair: tuple[TargetModel, DFlashDrafter], kernels: bool, spec: SpecParams,
          sampling: SamplingParams, static_prefill: bool = False,
          reduce_fusions: bool = True, rope_epilogue: bool = True) -> dict[str, list[int]]:
    target, drafter = pair
    target.backend = Backend(kernels=kernels)
    config = EngineConfig(max_num_seqs=2, max_model_len=40, max_budget=8,
                          static_prefill=static_prefill, reduce_fusions=reduce_fusions,
                          rope_epilogue=rope_epilogue)
    plan = plan_pool(config, target.config, torch.device("cpu"), torch.float32, 0,
                     drafter.config.block_size - 1)
    local = LocalDrafter(drafter, target.embeddings, plan.num_slots, plan.max_model_len,
                         backend=Backend(kernels=kernels))
    engine = Engine(target, local, config, plan)
    engine.add_request("a", GenerationRequest(PROMPT, 10, sampling, spec, ignore_eos=True))
    engine.add_request("b", GenerationRequest(PROMPT[:3], 9, sampling, SpecParams("linear"),
                                              ignore_eos=True))
    tokens: dict[str, list[int]] = {"a": [], "b": []}
    while engine.has_work:
        for request_id, result in engine.step():
            tokens[request_id] += result.new_tokens
    return tokens


@pytest.mark.parametrize("spec,sampling", [
    (SpecParams("ar"), SamplingParams()),
    (SpecParams("tree", 8), SamplingParams()),
    (SpecParams("shadow", 8), SamplingParams(temperature=0.7, seed=3)),
])
def test_engine_on_the_kernels_serves_what_it_serves_on_the_references(
        pair, spec: SpecParams, sampling: SamplingParams) -> None:
    on_kernels = serve(pair, True, spec, sampling)
    assert on_kernels == serve(pair, False, spec, sampling)
    if sampling.is_greedy:
        assert on_kernels == serve(pair, True, SpecParams("ar"), sampling)


@pytest.mark.parametrize("spec,sampling", [
    (SpecParams("tree", 8), SamplingParams()),
    (SpecParams("linear"), SamplingParams(temperature=0.7, seed=5)),
])
def test_the_padded_static_prefill_serves_bitwise_what_the_exact_shape_one_serves(
        pair, spec: SpecParams, sampling: SamplingParams) -> None:
    """The shape the GPU replays as a graph: padding into the scratch row changes no row."""
    assert serve(pair, True, spec, sampling, static_prefill=True) == serve(
        pair, True, spec, sampling)


@pytest.mark.parametrize("kernels", [True, False])
def test_a_batched_prefill_gives_each_prompt_what_its_prefill_alone_gives(
        pair, kernels: bool) -> None:
    """Bitwise on the kernels (fixed tiles, per-query attention); on the CPU references the
    GEMM's blocking may follow the row count, so there only within rounding."""
    from ddtree.models.meta import causal_meta, prompts_meta

    target, _ = pair
    target.backend = Backend(kernels=kernels)
    prompts = [PROMPT, PROMPT[:3], [7, 8, 9, 10, 11, 12, 13, 14, 15], [4]]
    lengths = [len(p) for p in prompts]
    together = target.new_pool(len(prompts), 40)
    out = target(torch.tensor([t for p in prompts for t in p]),
                 prompts_meta([3, 2, 1, 0], lengths, torch.device("cpu")), together, (0, 1))
    alone = target.new_pool(len(prompts), 40)
    offset = 0
    for slot, prompt in zip([3, 2, 1, 0], prompts, strict=True):
        one = target(torch.tensor(prompt), causal_meta(slot, 0, len(prompt), torch.device("cpu")),
                     alone, (0, 1))
        span = slice(offset, offset + len(prompt))
        offset += len(prompt)
        assert out.features is not None and one.features is not None
        if kernels:
            assert torch.equal(out.logits[span], one.logits)
            assert torch.equal(out.features[span], one.features)
        else:
            torch.testing.assert_close(out.logits[span], one.logits, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(out.features[span], one.features, rtol=1e-4, atol=1e-4)
    for mine, theirs in ((together.k, alone.k), (together.v, alone.v)):
        assert torch.equal(mine, theirs) if kernels else torch.allclose(mine, theirs, atol=1e-4)


def test_the_reduce_fusions_serve_the_tokens_served_without_them(
        pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """With tilings that split K for the pair's o_proj and down (128 x 128, 128 x 192) and
    QKV (256 x 128), the norms after o_proj / down ride on their reduces and RoPE on the
    QKV partials (the target's layers and the drafter's): the same tokens as without."""
    from ddtree.kernels import fused_linear, matmul, rope

    for shape in ("128x128", "128x192", "256x128"):
        monkeypatch.setitem(matmul.TUNED, f"{shape}:float32", {
            "block_m": 32, "block_n": 32, "block_k": 32, "split_k": 2, "num_warps": 4,
            "num_stages": 2})
    fused = {"norms": 0, "rope": 0}
    linear_norm, rope_store = fused_linear.linear_norm, rope.rope_store

    def counted_norm(*args, **kwargs):  # type: ignore[no-untyped-def]
        result = linear_norm(*args, **kwargs)
        fused["norms"] += result is not None
        return result

    def counted_rope(qkv, *args, **kwargs):  # type: ignore[no-untyped-def]
        fused["rope"] += isinstance(qkv, matmul.SplitPartials)
        return rope_store(qkv, *args, **kwargs)

    monkeypatch.setattr(fused_linear, "linear_norm", counted_norm)
    monkeypatch.setattr(rope, "rope_store", counted_rope)
    tree = serve(pair, True, SpecParams("tree", 8), SamplingParams())
    assert fused["norms"] > 0 and fused["rope"] > 0
    # the same tokens as the separate kernels, which serve ar's (the test above)
    assert tree == serve(pair, True, SpecParams("tree", 8), SamplingParams(),
                         reduce_fusions=False)


def test_the_rope_epilogue_serves_the_tokens_served_without_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Llama-style target (no head norms, a QKV tiling that does not split K): with RoPE
    and the KV store as its QKV GEMM's epilogue a tree serves the tokens ar serves on the
    separate kernels (the GEMM, then `rope_store`)."""
    from ddtree.kernels import rope

    llama = make_pair("llama")
    assert not llama[0].config.qk_norm
    launched = {"epilogue": 0}
    launch = rope._launch_linear_rope

    def counted(*args):  # type: ignore[no-untyped-def]
        launched["epilogue"] += 1
        launch(*args)

    monkeypatch.setattr(rope, "_launch_linear_rope", counted)
    tree = serve(llama, True, SpecParams("tree", 8), SamplingParams())
    assert launched["epilogue"] > 0
    launched["epilogue"] = 0
    assert tree == serve(llama, True, SpecParams("ar"), SamplingParams(), rope_epilogue=False)
    assert launched["epilogue"] == 0


def deep_drafter(target: TargetModel) -> DFlashDrafter:
    """Two layers and a 1,024-wide MLP (its down projection splits K when the split is
    allowed for small weights: the next layer's norm then runs in that GEMM's reduce)."""
    torch.manual_seed(1)
    drafter = DFlashDrafter(DrafterConfig(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=64, intermediate_size=1024, vocab_size=96, block_size=4,
        num_target_layers=2, target_layer_ids=(0, 1), has_mask_embedding=False,
        mask_token_id=5))
    for name, param in drafter.named_parameters():
        torch.nn.init.normal_(param, std=0.3 if "mlp" not in name else 0.05)
        if "norm" in name:
            param.data = 1 + param.data / 3
    return drafter.eval().requires_grad_(False).fuse_weights()


@pytest.mark.parametrize("deep", [False, True])
def test_context_rows_in_the_blocks_qkv_gemm_store_and_draft_the_separate_bits(
        pair, deep: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the kernels a round's new context rows are projected in each layer's block QKV
    GEMM (`LocalDrafter.draft_logits`): the block's logits and every real row's K/V are
    those of appending the context first, bit for bit (the ignored rows past a row's
    pending count go to the scratch row instead of under the block). The draft half's
    inputs from PyTorch's builders instead of `draft_prologue`'s kernels: the same.
    `deep`: two layers (a mask token, no mask embedding), the next layer's normed rows
    written into the joined buffer by the down projection's split-K reduce."""
    target, drafter = pair
    if deep:
        monkeypatch.setattr(matmul, "MIN_SPLIT_BYTES", 0)
        drafter = deep_drafter(target)
        config = matmul.linear_config(128, 1024, torch.float32, 8)
        assert matmul.splits_of(config, 1024) > 1
    local = LocalDrafter(drafter, target.embeddings, 3, 40, backend=Backend(kernels=True))
    block = drafter.config.block_size
    gen = torch.Generator().manual_seed(7)
    width = drafter.config.num_feature_layers * drafter.config.hidden_size
    for slot in range(3):
        local.start(slot, "", torch.randn(9, width, generator=gen))
    rows = torch.tensor([2, 0, local.scratch])  # the last: a padding row
    committed = torch.tensor([11, 9, 0])
    num_pending = torch.tensor([3, 1, 0])
    pending = torch.randn(3, block, width, generator=gen)
    bonus = torch.tensor([7, 8, 0])
    before = (local.pool.k.clone(), local.pool.v.clone())
    merged = local.draft_logits(rows, committed, pending, num_pending, bonus)
    pools = (local.pool.k.clone(), local.pool.v.clone())
    local.pool.k.copy_(before[0])
    local.pool.v.copy_(before[1])
    local.backend = Backend(kernels=True, draft_prologue=False)
    assert torch.equal(local.draft_logits(rows, committed, pending, num_pending, bonus),
                       merged)
    assert torch.equal(local.pool.k, pools[0]) and torch.equal(local.pool.v, pools[1])
    local.backend = Backend(kernels=True)
    local.pool.k.copy_(before[0])
    local.pool.v.copy_(before[1])
    fused = drafter.fuse_infer(pending, local.backend)
    drafter.append_context(local.pool, rows, committed - num_pending, fused, local.backend)
    separate = drafter.draft(local.pool, rows, committed, bonus, local.embeddings,
                             local.backend)
    assert torch.equal(merged[:2], separate[:2])
    meta = context_meta(rows, committed - num_pending, block, num_pending, local.scratch)
    kept = meta.write_slot.view(3, block) != local.scratch
    assert kept.sum(1).tolist() == [3, 1, 0]  # past its pending count a row writes scratch
    for mine, theirs in zip(pools, (local.pool.k, local.pool.v), strict=True):
        assert torch.equal(mine[:, :3], theirs[:, :3])  # every real row, every position
