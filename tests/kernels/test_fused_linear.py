"""GEMMs with a fused prologue: `norm_linear` equals the RMSNorm kernel then the invariant
linear, and `swiglu_down` equals silu_mul then the linear, bitwise (h too), across K-block
and split-K boundaries and ragged sizes; a row's result does not depend on the batch; both
match their float64 references; a target gives the same logits and features fused or not.
The SwiGLU epilogue (`linear_swiglu`: the gate_up GEMM storing silu(gate) * up) equals the
GEMM then silu_mul bitwise, is batch invariant and leaves a target's outputs unchanged."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ddtree.kernels.fused_linear import (
    linear_norm,
    linear_swiglu,
    linear_swiglu_reference,
    norm_linear,
    norm_linear_reference,
    norm_linear_with_config,
    swiglu_down,
    swiglu_down_reference,
    swiglu_down_with_config,
    swiglu_epilogue_config,
)
from ddtree.kernels.matmul import LinearConfig, linear_config, linear_with_config
from ddtree.kernels.rmsnorm import rms_norm
from ddtree.kernels.swiglu import silu_mul
from ddtree.models.ops import Backend
from ddtree.models.target import TargetModel
from ddtree.models.target_config import TargetConfig
from tests.kernels.test_matmul import SPLIT_3, SPLIT_3_FP32  # K = 320: 4, 4, 2 blocks

EPS = 1e-6

# (name, N, K, dtype, residual, bias, config or None for linear_config's). K is H for the
# norm, I for SwiGLU (x is then (T, 2I)).
NORM_CASES = {
    "bf16-split-k-residual-bias": (80, 320, torch.bfloat16, True, True, SPLIT_3),
    "fp32-split-k-no-residual": (48, 320, torch.float32, False, True, SPLIT_3_FP32),
    "fp16-ragged-residual": (40, 100, torch.float16, True, False, None),
    "bf16-ragged-own-config": (72, 200, torch.bfloat16, True, True, None),
    "bf16-demo-qkv": (960, 576, torch.bfloat16, True, False, None),
    # 33 chunks of 64: the norm kernel's groups of 16 chunks (the last ragged) against the
    # prologue's chunk after chunk, bitwise
    "fp16-norm-groups-ragged": (40, 2100, torch.float16, True, False, None),
}
SWIGLU_CASES = {
    "bf16-split-k": (80, 320, torch.bfloat16, False, False, SPLIT_3),
    "fp32-split-k-bias": (48, 320, torch.float32, False, True, SPLIT_3_FP32),
    "fp16-ragged": (40, 100, torch.float16, False, False, None),
    "bf16-demo-down-tuned-split": (576, 1536, torch.bfloat16, False, False, None),
}
ROWS = 80  # two row blocks of 64


def make(case: tuple, x_width: int, seed: int) -> tuple:
    out_features, in_features, dtype, has_residual, has_bias, config = case
    gen = torch.Generator().manual_seed(seed)
    x = (2 * torch.randn(ROWS, x_width, generator=gen)).to(dtype)
    residual = torch.randn(ROWS, x_width, generator=gen).to(dtype) if has_residual else None
    norm_weight = (1 + torch.randn(in_features, generator=gen) / 5).to(dtype)
    weight = (torch.randn(out_features, in_features, generator=gen) / 10).to(dtype)
    bias = torch.randn(out_features, generator=gen).to(dtype) if has_bias else None
    config = config or linear_config(out_features, in_features, dtype)
    return x, residual, norm_weight, weight, bias, config


@pytest.fixture(params=list(NORM_CASES), scope="module")
def norm_problem(request: pytest.FixtureRequest) -> tuple:
    case = NORM_CASES[request.param]
    x, residual, norm_weight, weight, bias, config = make(case, case[1], 1)
    whole = norm_linear_with_config(x, residual, norm_weight, EPS, weight, bias, config)
    return x, residual, norm_weight, weight, bias, config, whole


@pytest.fixture(params=list(SWIGLU_CASES), scope="module")
def swiglu_problem(request: pytest.FixtureRequest) -> tuple:
    case = SWIGLU_CASES[request.param]
    gate_up, _, _, weight, bias, config = make(case, 2 * case[1], 2)
    return gate_up, weight, bias, config, swiglu_down_with_config(gate_up, weight, bias, config)


def test_norm_linear_equals_the_norm_kernel_then_the_linear(norm_problem: tuple) -> None:
    x, residual, norm_weight, weight, bias, config, (out, h) = norm_problem
    normed, expected_h = rms_norm(x, norm_weight, EPS, residual)
    assert torch.equal(h, expected_h)
    assert torch.equal(out, linear_with_config(normed, weight, bias, None, config))


@pytest.mark.parametrize("num_rows, offset", [(1, 0), (1, 77), (3, 5), (17, 60), (65, 3)])
def test_norm_linear_rows_do_not_depend_on_the_batch(norm_problem: tuple, num_rows: int,
                                                     offset: int) -> None:
    x, residual, norm_weight, weight, bias, config, (out, h) = norm_problem
    rows = slice(offset, offset + num_rows)
    part = residual[rows] if residual is not None else None
    part_out, part_h = norm_linear_with_config(x[rows], part, norm_weight, EPS, weight, bias,
                                               config)
    assert torch.equal(part_out, out[rows]) and torch.equal(part_h, h[rows])


def test_norm_linear_matches_the_float64_reference(norm_problem: tuple) -> None:
    x, residual, norm_weight, weight, bias, _, (out, h) = norm_problem
    expected, expected_h = norm_linear_reference(x, residual, norm_weight, EPS, weight, bias)
    assert_close_in_norm(out, expected)
    assert_close_in_norm(h, expected_h)


def test_swiglu_down_equals_silu_mul_then_the_linear(swiglu_problem: tuple) -> None:
    gate_up, weight, bias, config, out = swiglu_problem
    assert torch.equal(out, linear_with_config(silu_mul(gate_up), weight, bias, None, config))


@pytest.mark.parametrize("num_rows, offset", [(1, 0), (1, 77), (3, 5), (17, 60), (65, 3)])
def test_swiglu_down_rows_do_not_depend_on_the_batch(swiglu_problem: tuple, num_rows: int,
                                                     offset: int) -> None:
    gate_up, weight, bias, config, out = swiglu_problem
    rows = slice(offset, offset + num_rows)
    assert torch.equal(swiglu_down_with_config(gate_up[rows], weight, bias, config), out[rows])


def test_swiglu_down_matches_the_float64_reference(swiglu_problem: tuple) -> None:
    gate_up, weight, bias, _, out = swiglu_problem
    assert_close_in_norm(out, swiglu_down_reference(gate_up, weight, bias))


def assert_close_in_norm(out: torch.Tensor, expected: torch.Tensor) -> None:
    """The relative error bound of tests/kernels/test_matmul.py."""
    assert out.dtype == expected.dtype and not out.isnan().any()
    error = ((out.double() - expected.double()).norm() / expected.double().norm()).item()
    assert error < (1e-5 if out.dtype == torch.float32 else 1e-2), error


def test_without_residual_h_is_the_input_and_empty_batches_work() -> None:
    x, weight = torch.randn(3, 64), torch.randn(16, 64)
    assert norm_linear(x, None, torch.ones(64), EPS, weight)[1] is x
    out, h = norm_linear(x[:0], x[:0], torch.ones(64), EPS, weight)
    assert out.shape == (0, 16) and h.shape == (0, 64)
    assert swiglu_down(torch.randn(0, 64), torch.randn(16, 32)).shape == (0, 16)


def test_rejects_malformed_arguments() -> None:
    weight = torch.randn(16, 32)
    with pytest.raises(AssertionError):
        swiglu_down(torch.randn(2, 32), weight)  # gate_up must be (T, 2I)
    with pytest.raises(AssertionError):
        norm_linear(torch.randn(2, 32), None, torch.ones(16), EPS, weight)
    with pytest.raises(AssertionError):
        norm_linear(torch.randn(2, 32), torch.randn(2, 32).half(), torch.ones(32), EPS, weight)


# The SwiGLU epilogue: (2I, K) [gate | up] weights, x (T, K); config None = the tuned or
# default tiling of the weight with half its BLOCK_N (swiglu_epilogue_config).
EPILOGUE_CASES = {
    "bf16-ragged-own-config": (2 * 40, 100, torch.bfloat16, None),
    "fp16-two-k-blocks": (2 * 48, 128, torch.float16, LinearConfig(64, 16, 64, 1, 4, 2)),
    "fp32-ragged": (2 * 24, 70, torch.float32, LinearConfig(32, 16, 32, 1, 4, 2)),
    "bf16-demo-gate-up-tuned": (3072, 576, torch.bfloat16, None),
}


@pytest.fixture(params=list(EPILOGUE_CASES), scope="module")
def epilogue_problem(request: pytest.FixtureRequest) -> tuple:
    two_i, k, dtype, config = EPILOGUE_CASES[request.param]
    gen = torch.Generator().manual_seed(3)
    x = (2 * torch.randn(ROWS, k, generator=gen)).to(dtype)
    weight = (torch.randn(two_i, k, generator=gen) / 10).to(dtype)
    config = config or swiglu_epilogue_config(weight)
    assert config is not None
    return x, weight, config, linear_swiglu(x, weight, config)


def test_the_swiglu_epilogue_equals_the_linear_then_silu_mul(epilogue_problem: tuple) -> None:
    """Bitwise, against the plain GEMM at the weight's own tiling (twice the BLOCK_N)."""
    x, weight, config, out = epilogue_problem
    plain = dataclasses.replace(config, block_n=2 * config.block_n)
    assert out.shape == (x.shape[0], weight.shape[0] // 2)
    assert torch.equal(out, silu_mul(linear_with_config(x, weight, None, None, plain)))


@pytest.mark.parametrize("num_rows, offset", [(1, 0), (1, 77), (3, 5), (17, 60), (65, 3)])
def test_swiglu_epilogue_rows_do_not_depend_on_the_batch(epilogue_problem: tuple,
                                                         num_rows: int, offset: int) -> None:
    x, weight, config, out = epilogue_problem
    rows = slice(offset, offset + num_rows)
    assert torch.equal(linear_swiglu(x[rows], weight, config), out[rows])


def test_swiglu_epilogue_matches_the_float64_reference(epilogue_problem: tuple) -> None:
    """Three roundings to the model dtype (gate and up, silu, the product): in bf16 the
    CPU interpreter truncates each instead of rounding (kernels/NOTES.md), up to one ulp
    (2^-7) each instead of half of one, so the bound is two ulps, not the GEMM's 1e-2."""
    x, weight, _, out = epilogue_problem
    expected = linear_swiglu_reference(x, weight)
    if out.dtype != torch.bfloat16:
        assert_close_in_norm(out, expected)
        return
    error = ((out.double() - expected.double()).norm() / expected.double().norm()).item()
    assert error < 2 ** -6, error


def test_no_epilogue_where_the_weight_splits_k() -> None:
    """The Qwen3-8B-shaped down weight's tuned tiling splits K; a gate_up weight that did
    would get no epilogue (ops falls back to the GEMM then silu_mul)."""
    assert linear_config(4096, 12288, torch.bfloat16).split_k > 1
    assert swiglu_epilogue_config(torch.empty(4096, 12288, dtype=torch.bfloat16)) is None
    assert swiglu_epilogue_config(torch.empty(3072, 576, dtype=torch.bfloat16)) is not None


# linear_norm: a split-K projection joining the residual stream, with the norm after it
# in its reduce. (name: N, K, dtype, bias, config or None for the tuned one)
SPLIT_4 = LinearConfig(32, 32, 32, 4, 4, 2)  # K = 320: blocks of 3, 3, 3, 1 per split
LINEAR_NORM_CASES = {
    "bf16-split-3-bias": (80, 320, torch.bfloat16, True, SPLIT_3),
    "fp32-split-3": (48, 320, torch.float32, False, SPLIT_3_FP32),
    "fp16-ragged-n-split-4": (100, 320, torch.float16, True, SPLIT_4),
    "bf16-wide-row-split-4": (1200, 320, torch.bfloat16, False, SPLIT_4),  # two norm groups
    "bf16-demo-down-tuned": (576, 1536, torch.bfloat16, False, None),
}


@pytest.fixture(params=list(LINEAR_NORM_CASES), scope="module")
def linear_norm_problem(request: pytest.FixtureRequest) -> tuple:
    out_features, in_features, dtype, has_bias, config = LINEAR_NORM_CASES[request.param]
    gen = torch.Generator().manual_seed(out_features)
    x = (2 * torch.randn(ROWS, in_features, generator=gen)).to(dtype)
    residual = torch.randn(ROWS, out_features, generator=gen).to(dtype)
    weight = (torch.randn(out_features, in_features, generator=gen) / 10).to(dtype)
    bias = torch.randn(out_features, generator=gen).to(dtype) if has_bias else None
    norm_weight = (1 + torch.randn(out_features, generator=gen) / 5).to(dtype)
    config = config or linear_config(out_features, in_features, dtype)
    fused = linear_norm(x, weight, bias, residual, norm_weight, EPS, config)
    assert fused is not None
    return x, weight, bias, residual, norm_weight, config, fused


def test_linear_norm_equals_the_linear_then_the_norm_kernel(linear_norm_problem: tuple) -> None:
    x, weight, bias, residual, norm_weight, config, (normed, h) = linear_norm_problem
    expected_normed, expected_h = rms_norm(linear_with_config(x, weight, bias, None, config),
                                           norm_weight, EPS, residual)
    assert torch.equal(h, expected_h) and torch.equal(normed, expected_normed)


@pytest.mark.parametrize("num_rows, offset", [(1, 0), (1, 77), (3, 5), (17, 60), (65, 3)])
def test_linear_norm_rows_do_not_depend_on_the_batch(linear_norm_problem: tuple,
                                                     num_rows: int, offset: int) -> None:
    x, weight, bias, residual, norm_weight, config, (normed, h) = linear_norm_problem
    rows = slice(offset, offset + num_rows)
    part = linear_norm(x[rows], weight, bias, residual[rows], norm_weight, EPS, config)
    assert part is not None
    assert torch.equal(part[0], normed[rows]) and torch.equal(part[1], h[rows])


def test_no_linear_norm_where_the_tiling_does_not_split_k() -> None:
    x, weight = torch.randn(3, 64), torch.randn(16, 64)
    assert linear_norm(x, weight, None, torch.randn(3, 16), torch.ones(16), EPS,
                       LinearConfig(32, 32, 32, 1, 4, 2)) is None
    # two K blocks cannot make four splits: two it is, and the norm rides on them
    fused = linear_norm(x, weight, None, torch.randn(3, 16), torch.ones(16), EPS,
                        LinearConfig(32, 32, 32, 4, 4, 2))
    assert fused is not None


# Each fusion against the separate kernels (no prologue, no epilogue, no reduce fusion).
SEPARATE = Backend(kernels=True, swiglu_epilogue=False, reduce_fusions=False)
FUSIONS = {"fused prologues": Backend(kernels=True, fused=True, swiglu_epilogue=False,
                                      reduce_fusions=False),
           "SwiGLU epilogue": Backend(kernels=True, swiglu_epilogue=True, reduce_fusions=False),
           "reduce fusions": Backend(kernels=True, swiglu_epilogue=False),
           "SwiGLU epilogue and reduce fusions": Backend(kernels=True)}
# the test target's o_proj (128 x 128), down (128 x 192) and QKV (256 x 128) tilings
# split K, so that the norms after o_proj and down run in their reduces and RoPE finishes
# the QKV partials
SPLIT_TILING = {"block_m": 32, "block_n": 32, "block_k": 32, "split_k": 2, "num_warps": 4,
                "num_stages": 2}


@pytest.mark.parametrize("fusion", list(FUSIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_target_gives_the_same_logits_and_features_fused_or_not(
        dtype: torch.dtype, fusion: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree.kernels import matmul

    for shape in ("128x128", "128x192", "256x128"):
        monkeypatch.setitem(matmul.TUNED, f"{shape}:{str(dtype).removeprefix('torch.')}",
                            SPLIT_TILING)
    torch.manual_seed(0)
    target = TargetModel(TargetConfig.from_hf({  # qkv bias (Qwen2) and q/k norms (Qwen3)
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 96,
        "hidden_size": 128, "intermediate_size": 192, "num_hidden_layers": 3,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
        "attention_bias": True, "rms_norm_eps": 1e-6, "max_position_embeddings": 64}))
    for param in target.parameters():
        torch.nn.init.normal_(param, std=0.3)
    target = target.to(dtype).eval().requires_grad_(False).fuse_weights()
    ids = torch.randint(0, 96, (2, 7))
    outputs = []
    for backend in (FUSIONS[fusion], SEPARATE):
        target.backend = backend
        outputs.append(target.causal(ids, feature_layers=(0, 1, 2)))
    assert torch.equal(outputs[0].logits, outputs[1].logits)
    assert torch.equal(outputs[0].features, outputs[1].features)


def test_prologue_pipelines_fit_the_shared_memory() -> None:
    """A prologue GEMM keeps its tiling's stages where they fit the H200's shared memory
    and drops the rest (the 8B down projection's SwiGLU prologue asked 256 KB at 6 stages
    of 64x64x128, lease 15); a plain GEMM always keeps them."""
    from ddtree.kernels.matmul import SHARED_BYTES, pipeline_stages
    from ddtree.kernels.prologues import NORM, PLAIN, SWIGLU

    down_8b = LinearConfig(64, 64, 128, 2, 4, 6)
    qkv_8b = LinearConfig(64, 128, 128, 2, 4, 4)
    demo = LinearConfig(64, 64, 64, 1, 4, 3)
    assert pipeline_stages(down_8b, PLAIN.value, 2) == 6
    assert pipeline_stages(down_8b, SWIGLU.value, 2) == 4  # 48 KB a stage: 160 KB compiled
    assert pipeline_stages(qkv_8b, NORM.value, 2) == 3  # 232 KB at 4 stages, 168 at 3
    assert pipeline_stages(demo, NORM.value, 2) == 3 == pipeline_stages(demo, SWIGLU.value, 2)
    huge = LinearConfig(128, 256, 256, 1, 8, 4)
    assert pipeline_stages(huge, NORM.value, 4) == 2  # never below double buffering
    for config, prologue in ((down_8b, SWIGLU.value), (qkv_8b, NORM.value)):
        stages = pipeline_stages(config, prologue, 2)
        a_tiles = 2 if prologue == SWIGLU.value else 1
        stage = (a_tiles * config.block_m + config.block_n) * config.block_k * 2
        assert stages * stage + 4 * config.block_m * config.block_n <= SHARED_BYTES
