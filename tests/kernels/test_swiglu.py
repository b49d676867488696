"""SwiGLU kernel: silu(gate) * up with eager's rounding steps, row by row."""

from __future__ import annotations

import pytest
import torch

from ddtree.kernels.swiglu import silu_mul, silu_mul_reference

TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 1e-3),
             torch.bfloat16: (2e-2, 2e-2)}  # interpreter bf16 casts truncate


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("inner", [1536, 100])
def test_matches_the_reference(dtype: torch.dtype, inner: int) -> None:
    gen = torch.Generator().manual_seed(inner)
    gate_up = (2 * torch.randn(6, 2 * inner, generator=gen)).to(dtype)
    out = silu_mul(gate_up)
    assert out.shape == (6, inner) and out.dtype == dtype
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(out, silu_mul_reference(gate_up), rtol=rtol, atol=atol)


def test_a_row_does_not_depend_on_the_batch() -> None:
    gate_up = torch.randn(5, 2 * 1536).half()
    assert torch.equal(silu_mul(gate_up[2:3]), silu_mul(gate_up)[2:3])


def test_rejects_an_odd_width() -> None:
    with pytest.raises(AssertionError):
        silu_mul(torch.randn(2, 7))
