"""RoPE + KV store kernel: q and the stored k match the reference's rounding steps (with
and without Qwen3's head norms), v is copied exactly, nothing else in the pool is touched,
and a row does not depend on the batch."""

from __future__ import annotations

import dataclasses

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows, num_heads, num_kv_heads, head_dim, hidden, block_n, with_bias", [
    (5, 9, 3, 64, 96, 32, False),  # SmolLM2 heads, K not a whole number of blocks, 2 parts
    (40, 4, 2, 64, 64, 128, True),  # two row tiles, a whole half per program, a bias
    (3, 2, 1, 128, 64, 64, False),  # head dim 128
])
def test_the_rope_epilogue_gives_the_gemm_then_rope_stores_bits(
        monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, rows: int, num_heads: int,
        num_kv_heads: int, head_dim: int, hidden: int, block_n: int, with_bias: bool) -> None:
    """The QKV GEMM left pending (matmul.PendingLinear) runs with RoPE and the KV store as
    its epilogue: the q, k and v of the GEMM then `rope_store`, bit for bit, and nothing
    else in the pool touched (NaN)."""
    from ddtree.kernels import matmul, rope
    from ddtree.kernels.matmul import LinearConfig, PendingLinear, linear_with_config

    args = problem(rows, num_heads, num_kv_heads, head_dim, dtype, with_norm=False)
    width = args["qkv"].shape[1]
    tiling = LinearConfig(32, block_n, 32, 1, 4, 2)
    monkeypatch.setitem(matmul.TUNED, matmul.tuned_key(width, hidden, dtype),
                        dataclasses.asdict(tiling))
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, hidden, generator=gen).to(dtype)
    weight = (torch.randn(width, hidden, generator=gen) / 8).to(dtype)
    bias = torch.randn(width, generator=gen).to(dtype) if with_bias else None
    pending = PendingLinear(x, weight, bias)
    config = rope.rope_epilogue_config(pending, num_heads, num_kv_heads, has_norm=False)
    assert config is not None and config.block_n == min(head_dim // 2, block_n // 2)
    launched = count_launches(monkeypatch)
    fused, separate = with_fresh_pool(args), with_fresh_pool(args)
    fused["qkv"] = pending
    separate["qkv"] = linear_with_config(x, weight, bias, None, tiling)
    assert torch.equal(rope_store(**fused), rope_store(**separate))
    assert launched == [1]
    for cache in ("k_cache", "v_cache"):
        assert torch.equal(fused[cache].nan_to_num(), separate[cache].nan_to_num())
        assert torch.equal(fused[cache].isnan(), separate[cache].isnan())


def count_launches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one at each launch of the RoPE-epilogue GEMM."""
    from ddtree.kernels import rope

    launched: list[int] = []
    launch = rope._launch_linear_rope

    def counted(*args):  # type: ignore[no-untyped-def]
        launched.append(1)
        launch(*args)

    monkeypatch.setattr(rope, "_launch_linear_rope", counted)
    return launched


@pytest.mark.parametrize("with_norm, split_k", [(True, 1), (False, 2)])
def test_a_pending_gemm_runs_first_where_the_epilogue_does_not_apply(
        monkeypatch: pytest.MonkeyPatch, with_norm: bool, split_k: int) -> None:
    """Head norms (Qwen3) or a tiling that splits K: the GEMM runs, then `rope_store`."""
    from ddtree.kernels import matmul, rope
    from ddtree.kernels.matmul import LinearConfig, PendingLinear, invariant_linear

    args = problem(4, 4, 2, 64, torch.float32, with_norm=with_norm)
    width = args["qkv"].shape[1]
    monkeypatch.setitem(matmul.TUNED, matmul.tuned_key(width, 64, torch.float32),
                        dataclasses.asdict(LinearConfig(32, 32, 32, split_k, 4, 2)))
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, 64, generator=gen)
    weight = torch.randn(width, 64, generator=gen) / 8
    pending = PendingLinear(x, weight, None)
    assert rope.rope_epilogue_config(pending, 4, 2, has_norm=with_norm) is None
    launched = count_launches(monkeypatch)
    fused, separate = with_fresh_pool(args), with_fresh_pool(args)
    fused["qkv"], separate["qkv"] = pending, invariant_linear(x, weight)
    assert torch.equal(rope_store(**fused), rope_store(**separate))
    assert launched == []
    for cache in ("k_cache", "v_cache"):
        assert torch.equal(fused[cache].nan_to_num(), separate[cache].nan_to_num())


def test_the_rope_epilogue_keeps_a_row_independent_of_the_batch() -> None:
    from ddtree.kernels.matmul import PendingLinear

    args = problem(6, 9, 3, 64, torch.float16, with_norm=False)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(6, 64, generator=gen).half()
    weight = (torch.randn(args["qkv"].shape[1], 64, generator=gen) / 8).half()
    whole = rope_store(**{**with_fresh_pool(args), "qkv": PendingLinear(x, weight, None)})
    one = with_fresh_pool(args)
    for key in ("positions", "write_slot", "write_pos"):
        one[key] = args[key][3:4]
    one["qkv"] = PendingLinear(x[3:4], weight, None)
    assert torch.equal(rope_store(**one), whole[3:4])
