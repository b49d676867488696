"""Invariant linear: row t of the output is bitwise the same whatever the batch around it
(T from 1 to 130, any offset, split-K or not), it matches a float64 reference, and the
tiling is a function of the weight alone."""

from __future__ import annotations

import pytest
import torch

from ddtree.kernels.matmul import (
    ROW_TILES,
    TUNED,
    LinearConfig,
    default_linear_config,
    invariant_linear,
    linear_config,
    linear_reference,
    linear_with_config,
)

SPLIT_3 = LinearConfig(64, 32, 32, 3, 4, 2)  # K = 320: blocks of 4, 4 and 2 per split
SPLIT_3_FP32 = LinearConfig(32, 32, 32, 3, 4, 2)

# (name, N, K, dtype, bias, out dtype, config or None for linear_config's)
CASES = {
    "bf16-own-config": (96, 128, torch.bfloat16, True, None, None),
    "bf16-split-k-fp32-out": (80, 320, torch.bfloat16, False, torch.float32, SPLIT_3),
    "fp32-split-k": (48, 320, torch.float32, True, None, SPLIT_3_FP32),
    "fp16-ragged-k": (40, 100, torch.float16, False, None, None),  # K not a block multiple
}


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           out_dtype: torch.dtype | None, config: LinearConfig | None) -> torch.Tensor:
    if config is None:
        return invariant_linear(x, weight, bias, out_dtype)
    return linear_with_config(x, weight, bias, out_dtype, config)


@pytest.fixture(params=list(CASES), scope="module")
def problem(request: pytest.FixtureRequest) -> tuple:
    out_features, in_features, dtype, has_bias, out_dtype, config = CASES[request.param]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(140, in_features, generator=gen).to(dtype)
    weight = (torch.randn(out_features, in_features, generator=gen) / 10).to(dtype)
    bias = torch.randn(out_features, generator=gen).to(dtype) if has_bias else None
    return x, weight, bias, out_dtype, config


@pytest.mark.parametrize("num_rows, offset", [(1, 0), (1, 77), (2, 5), (17, 64), (65, 3),
                                               (130, 10)])
def test_rows_do_not_depend_on_the_batch(problem: tuple, num_rows: int, offset: int) -> None:
    x, weight, bias, out_dtype, config = problem
    whole = linear(x, weight, bias, out_dtype, config)
    part = linear(x[offset:offset + num_rows], weight, bias, out_dtype, config)
    assert torch.equal(part, whole[offset:offset + num_rows])


def test_matches_the_float64_reference(problem: tuple) -> None:
    x, weight, bias, out_dtype, config = problem
    out = linear(x, weight, bias, out_dtype, config)
    expected = linear_reference(x, weight, bias, out_dtype)
    assert out.dtype == (out_dtype or x.dtype) and not out.isnan().any()
    error = ((out.double() - expected.double()).norm() / expected.double().norm()).item()
    assert error < (1e-5 if out.dtype == torch.float32 else 1e-2), error


# Shapes of the demo target (SmolLM2-135M) and of Qwen3-8B: split-K only where the N
# tiles would leave the GPU mostly idle at small T and the weight takes several us to read.
MODEL_SPLITS = [
    (960, 576, 1), (576, 576, 1), (3072, 576, 1), (576, 1536, 1), (49152, 576, 1),
    (6144, 4096, 4), (4096, 4096, 4), (24576, 4096, 1), (4096, 12288, 4), (151936, 4096, 1),
]


@pytest.mark.parametrize("out_features, in_features, split_k", MODEL_SPLITS)
def test_model_shapes_get_whole_k_blocks_and_the_planned_split(
        out_features: int, in_features: int, split_k: int) -> None:
    config = default_linear_config(out_features, in_features, torch.bfloat16)
    assert config.split_k == split_k
    assert in_features % config.block_k == 0  # the unmasked-K path


def test_tuned_tilings_are_whole_k_blocks_and_used_for_their_shape() -> None:
    """The table measured on the H200 (scripts/gpu/tune_linear.py): each entry splits K into
    whole blocks and is what linear_config answers for its shape."""
    assert TUNED, "the tuned table is missing"
    for key, fields in TUNED.items():
        shape, dtype = key.split(":")
        out_features, in_features = (int(n) for n in shape.split("x"))
        config = linear_config(out_features, in_features, getattr(torch, dtype))
        assert config == LinearConfig(**fields)
        assert in_features % config.block_k == 0 and config.split_k >= 1


def test_row_tiles_change_only_the_output_tiles() -> None:
    """linear_rows.json: more rows may take other M x N tiles and warps, never another
    BLOCK_K, split-K or stage count (each element's K order stays the weight's)."""
    assert ROW_TILES, "the row tiles table is missing"
    for key, entries in ROW_TILES.items():
        shape, dtype = key.split(":")
        out_features, in_features = (int(n) for n in shape.split("x"))
        base = linear_config(out_features, in_features, getattr(torch, dtype))
        assert [entry[0] for entry in entries] == sorted(entry[0] for entry in entries)
        for min_rows, block_m, block_n, warps in entries:
            for rows in (min_rows - 1, min_rows):
                config = linear_config(out_features, in_features, getattr(torch, dtype), rows)
                assert (config.block_k, config.split_k, config.num_stages) == (
                    base.block_k, base.split_k, base.num_stages)
            assert (config.block_m, config.block_n, config.num_warps) == (block_m, block_n, warps)
        assert linear_config(out_features, in_features, getattr(torch, dtype), 1) == base


def test_rows_past_the_row_tile_thresholds_keep_their_bits() -> None:
    """The demo target's QKV weight (two row tiles): T = 1, 33, 140 and 260 rows give each
    row the same bits (the interpreter's dots; bitwise on the H200: gemm_rows_sweep)."""
    gen = torch.Generator().manual_seed(5)
    weight = (torch.randn(960, 576, generator=gen) / 24).bfloat16()
    x = torch.randn(260, 576, generator=gen).bfloat16()
    whole = invariant_linear(x, weight)
    for rows in (1, 33, 140):
        assert torch.equal(invariant_linear(x[-rows:].contiguous(), weight), whole[-rows:])


def test_empty_batch_gives_an_empty_result() -> None:
    weight = torch.randn(16, 32)
    assert invariant_linear(torch.randn(0, 32), weight).shape == (0, 16)


def test_rejects_malformed_arguments() -> None:
    weight = torch.randn(16, 32)
    with pytest.raises(AssertionError, match="contiguous"):
        invariant_linear(torch.randn(32, 4).T, weight)
    with pytest.raises(AssertionError):
        invariant_linear(torch.randn(4, 32).bfloat16(), weight)
