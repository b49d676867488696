"""The drafter's split log-softmax (ddtree/kernels/log_softmax.py) agrees with
torch.log_softmax to float32 rounding: vocabularies that are not a multiple of a chunk,
one row or many, -inf logits (a masked vocabulary), a whole -inf chunk, rows of very
different scales. DDTREE_TEST_DEVICE=cuda runs the compiled kernels on the GPU (else the
interpreter on the CPU)."""

from __future__ import annotations

import os

import pytest
import torch

from ddtree.kernels import log_softmax

DEVICE = torch.device(os.environ.get("DDTREE_TEST_DEVICE", "cpu"))


@pytest.mark.parametrize(("rows", "vocab"), [(1, 8192), (3, 10_000), (15, 49_152)])
def test_matches_torch(rows: int, vocab: int) -> None:
    gen = torch.Generator().manual_seed(rows * vocab)
    x = torch.randn(rows, vocab, generator=gen) * torch.tensor([1.0, 30.0, 0.01])[
        torch.arange(rows) % 3][:, None]
    got = log_softmax.log_softmax(x.to(DEVICE)).cpu()
    want = torch.log_softmax(x, dim=-1)
    assert got.shape == want.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-5)


def test_minus_infinity_and_a_whole_masked_chunk() -> None:
    x = torch.randn(2, 3, 9000, generator=torch.Generator().manual_seed(1))
    x[0, 1, :4096] = float("-inf")  # the first chunk masked whole
    x[1, 2, ::7] = float("-inf")
    got = log_softmax.log_softmax(x.to(DEVICE)).cpu()
    want = torch.log_softmax(x, dim=-1)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=2e-6, atol=2e-5)


def test_the_cpu_keeps_torch_and_short_vocabularies_too() -> None:
    x = torch.randn(4, 20_000)
    assert torch.equal(log_softmax.vocab_log_softmax(x), torch.log_softmax(x, dim=-1))
    assert not log_softmax.supports(4096) and log_softmax.supports(8192)
