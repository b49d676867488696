"""RMSNorm kernel: the fused residual sum is exactly the eager one, the normalised rows
match the reference's rounding steps, and a row does not depend on the batch."""

from __future__ import annotations

import pytest
import torch

from ddtree.kernels.rmsnorm import rms_norm, rms_norm_reference

# Interpreter bf16 casts truncate (the GPU rounds to nearest): allow 2 bf16 ulps there.
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 1e-3),
             torch.bfloat16: (2e-2, 2e-2)}


def inputs(rows: int, hidden: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(hidden)
    x = (3 * torch.randn(rows, hidden, generator=gen)).to(dtype)
    residual = torch.randn(rows, hidden, generator=gen).to(dtype)
    weight = (1 + torch.randn(hidden, generator=gen) / 5).to(dtype)
    return x, residual, weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hidden", [576, 1000])
@pytest.mark.parametrize("with_residual", [False, True])
def test_matches_the_reference(dtype: torch.dtype, hidden: int, with_residual: bool) -> None:
    x, residual, weight = inputs(5, hidden, dtype)
    res = residual if with_residual else None
    normed, h = rms_norm(x, weight, 1e-6, res)
    expected, expected_h = rms_norm_reference(x, weight, 1e-6, res)
    if dtype != torch.bfloat16:  # the sum is one rounding of an exact float32 sum
        assert torch.equal(h, expected_h)
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(normed, expected, rtol=rtol, atol=atol)


def test_a_row_does_not_depend_on_the_batch() -> None:
    x, residual, weight = inputs(9, 576, torch.float16)
    normed, h = rms_norm(x, weight, 1e-5, residual)
    alone, alone_h = rms_norm(x[4:5], weight, 1e-5, residual[4:5])
    assert torch.equal(alone, normed[4:5]) and torch.equal(alone_h, h[4:5])


def test_without_residual_h_is_the_input() -> None:
    x, _, weight = inputs(2, 64, torch.float32)
    assert rms_norm(x, weight, 1e-6)[1] is x


def test_rejects_a_weight_of_another_dtype() -> None:
    x, _, weight = inputs(2, 64, torch.float16)
    with pytest.raises(AssertionError):
        rms_norm(x, weight.float(), 1e-6)


def fixed_order_norm(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """float32 RMSNorm with the sum of squares in the order prologues.sum_squares fixes:
    lane j (of 64) adds columns j, j + 64, j + 128, ... one after the other, then a
    pairwise tree adds neighbouring lanes; 1 / sqrt as the interpreter's rsqrt."""
    rows, hidden = h.shape
    chunks = -(-hidden // 64)
    padded = torch.zeros(rows, chunks * 64, dtype=torch.float32)
    padded[:, :hidden] = h
    acc = torch.zeros(rows, 64, dtype=torch.float32)
    for c in range(chunks):
        part = padded[:, c * 64:(c + 1) * 64]
        acc = acc + part * part
    while acc.shape[1] > 1:
        acc = acc[:, 0::2] + acc[:, 1::2]
    rstd = 1 / torch.sqrt(acc[:, 0] / hidden + eps)
    return weight * (h * rstd[:, None])


@pytest.mark.parametrize("hidden", [576, 1000, 2176, 4096])
def test_the_sum_of_squares_keeps_its_fixed_order(hidden: int) -> None:
    # the additions go chunk after chunk, then pairwise over the lanes: the order the
    # fused GEMM prologue shares (prologues.sum_squares), pinned here
    x, _, weight = inputs(3, hidden, torch.float32)
    normed, _ = rms_norm(x, weight, 1e-6)
    assert torch.equal(normed, fixed_order_norm(x, weight, 1e-6))
