"""RoPE + KV store kernel: q and the stored k match the reference's rounding steps (with
and without Qwen3's head norms), v is copied exactly, nothing else in the pool is touched,
and a row does not depend on the batch."""

from __future__ import annotations

import pytest
import torch

from ddtree.kernels.rope import rope_store, rope_store_reference

TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3),
             torch.bfloat16: (3e-2, 3e-2)}  # interpreter bf16 casts truncate


def problem(rows: int, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
            with_norm: bool) -> dict:
    gen = torch.Generator().manual_seed(head_dim + rows)
    width = (num_heads + 2 * num_kv_heads) * head_dim
    pool = torch.full((2, 3, 50, num_kv_heads, head_dim), float("nan"), dtype=dtype)

    def norm() -> torch.Tensor | None:
        return (1 + torch.randn(head_dim, generator=gen) / 5).to(dtype) if with_norm else None

    return dict(
        qkv=torch.randn(rows, width, generator=gen).to(dtype),
        positions=torch.randint(0, 5000, (rows,), generator=gen),
        inv_freq=1.0 / (1e6 ** (torch.arange(0, head_dim, 2).float() / head_dim)),
        k_cache=pool[0], v_cache=pool[1].clone(),
        write_slot=torch.randint(0, 3, (rows,), generator=gen),
        write_pos=torch.randperm(50, generator=gen)[:rows].int(),
        num_heads=num_heads, num_kv_heads=num_kv_heads,
        q_norm_weight=norm(), k_norm_weight=norm(),
    )


def with_fresh_pool(args: dict) -> dict:
    return {**args, "k_cache": args["k_cache"].clone(), "v_cache": args["v_cache"].clone()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim, with_norm", [
    (9, 3, 64, False),  # SmolLM2 heads
    (4, 1, 128, True),  # Qwen3-style head norms
])
def test_matches_the_reference(dtype: torch.dtype, num_heads: int, num_kv_heads: int,
                               head_dim: int, with_norm: bool) -> None:
    args = problem(5, num_heads, num_kv_heads, head_dim, dtype, with_norm)
    mine, theirs = with_fresh_pool(args), with_fresh_pool(args)
    q = rope_store(**mine)
    expected = rope_store_reference(**theirs)
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(q, expected, rtol=rtol, atol=atol)
    torch.testing.assert_close(mine["k_cache"], theirs["k_cache"], rtol=rtol, atol=atol,
                               equal_nan=True)  # untouched slots are still NaN
    assert torch.equal(mine["v_cache"].nan_to_num(), theirs["v_cache"].nan_to_num())
    assert torch.equal(mine["v_cache"].isnan(), theirs["v_cache"].isnan())


def test_a_row_does_not_depend_on_the_batch() -> None:
    args = problem(6, 4, 2, 64, torch.float16, with_norm=True)
    whole = rope_store(**with_fresh_pool(args))
    one = with_fresh_pool(args)
    for key in ("qkv", "positions", "write_slot", "write_pos"):
        one[key] = args[key][3:4]
    assert torch.equal(rope_store(**one), whole[3:4])


def test_rejects_a_single_head_norm() -> None:
    args = problem(2, 4, 2, 64, torch.float32, with_norm=True)
    with pytest.raises(AssertionError, match="both head norms"):
        rope_store(**{**args, "k_norm_weight": None})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim, with_norm, with_bias", [
    (9, 3, 64, False, True),  # SmolLM2 heads (a Qwen2-style bias)
    (4, 1, 128, True, False),  # Qwen3-style head norms
])
def test_the_split_partials_give_the_reduced_qkvs_bits(
        dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int,
        with_norm: bool, with_bias: bool) -> None:
    """RoPE straight from the QKV GEMM's split partials (no reduce launch) stores the q,
    k and v that the reduced qkv gives, bit for bit."""
    from ddtree.kernels.matmul import LinearConfig, linear_partials, linear_with_config

    args = problem(7, num_heads, num_kv_heads, head_dim, dtype, with_norm)
    width, hidden = args["qkv"].shape[1], 96
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(7, hidden, generator=gen).to(dtype)
    weight = (torch.randn(width, hidden, generator=gen) / 8).to(dtype)
    bias = torch.randn(width, generator=gen).to(dtype) if with_bias else None
    config = LinearConfig(32, 32, 32, 3, 4, 2)  # K = 96: three splits of one block
    partials = linear_partials(x, weight, bias, config)
    assert partials is not None and partials.part.shape == (3, 7, width)
    reduced, direct = with_fresh_pool(args), with_fresh_pool(args)
    reduced["qkv"] = linear_with_config(x, weight, bias, None, config)
    direct["qkv"] = partials
    assert torch.equal(rope_store(**direct), rope_store(**reduced))
    for cache in ("k_cache", "v_cache"):
        assert torch.equal(direct[cache].nan_to_num(), reduced[cache].nan_to_num())
        assert torch.equal(direct[cache].isnan(), reduced[cache].isnan())
    assert linear_partials(x, weight, bias, LinearConfig(32, 32, 32, 1, 4, 2)) is None
