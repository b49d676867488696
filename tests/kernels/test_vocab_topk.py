"""The vocabulary top-K kernels give `_stable_topk`'s tokens in its order: the k largest
logits first, ties to the lower token id (exact ties from integer logits, -0.0 against
0.0, -inf, logits of both signs), vocabularies that are not a multiple of a chunk, k from
1 to MAX_K, one or two levels of merges, and inside `build_round_tree`; and each row's
log-sum-exp from the same passes agrees with torch.logsumexp to float32 rounding."""

from __future__ import annotations

import pytest
import torch

from ddtree.kernels import vocab_topk
from ddtree.tree import _stable_topk, build_round_tree, set_fused_lse


def check(x: torch.Tensor, k: int) -> None:
    """Both selections (bitonic, K max-reduction rounds) give torch's answer; the
    log-sum-exp torch's to float32 rounding."""
    want = _stable_topk(x, k)
    for bitonic in (True, False):
        got, lse = vocab_topk.topk_logsumexp(x, k, bitonic=bitonic)
        assert got.dtype == torch.int64 and got.shape == want.shape == (*x.shape[:-1], k)
        assert torch.equal(got, want), (bitonic, got, want)
        assert lse.dtype == torch.float32 and lse.shape == x.shape[:-1]
        torch.testing.assert_close(lse, torch.logsumexp(x, dim=-1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("vocab", "k"), [(500, 1), (600, 5), (1100, 16), (1500, 64)])
def test_random_logits_and_log_probabilities(vocab: int, k: int) -> None:
    gen = torch.Generator().manual_seed(vocab + k)
    logits = 3 * torch.randn(1, 2, vocab, generator=gen)
    check(logits, k)  # both signs
    check(torch.log_softmax(logits, dim=-1), k)  # all <= 0
    check(logits.abs() + 40, k)  # all > 0, large


def test_the_log_sum_exp_of_a_long_peaked_row() -> None:
    """A Qwen3-sized row (151,936 tokens; 75 leaves of 2,048 here, for the interpreter's
    time), values from about -70 to 70: the leaves' partial sums rescaled to the row's
    max."""
    gen = torch.Generator().manual_seed(4)
    logits = 15 * torch.randn(1, 151936, generator=gen)
    got, lse = vocab_topk.topk_logsumexp(logits, 4, bitonic=False, leaf_chunk=2048)
    assert torch.equal(got, _stable_topk(logits, 4))
    torch.testing.assert_close(lse, torch.logsumexp(logits, dim=-1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("leaf_chunk", "warps"), [(64, (1, 4)), (2048, (4, 2))])
def test_other_leaf_chunks_and_warps_give_the_same_tokens(leaf_chunk: int,
                                                          warps: tuple[int, int]) -> None:
    """The tournament's other shapes (bench_vocab_topk's sweep): more merge levels (64
    tokens a leaf), fewer (2,048), several warps a program; ties across leaf borders."""
    gen = torch.Generator().manual_seed(leaf_chunk)
    logits = torch.randint(0, 4, (1, 4500), generator=gen).float()
    logp = torch.log_softmax(logits, dim=-1)
    k = 33
    got = vocab_topk.stable_topk(logp, k, leaf_chunk=leaf_chunk, warps=warps)
    assert torch.equal(got, _stable_topk(logp, k))


def test_exact_ties_go_to_the_lower_token_id() -> None:
    """Integer logits over three values: thousands of exact ties across chunk borders."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randint(0, 3, (2, 1200), generator=gen).float()
    check(torch.log_softmax(logits, dim=-1), 40)


def test_signed_zero_and_minus_infinity() -> None:
    """-0.0 and 0.0 tie (the lower id first); -inf ranks last, among itself by id, and
    is still returned when k exceeds the finite entries."""
    logp = torch.full((2, 1100), float("-inf"))
    logp[0, [5, 1050, 7]] = torch.tensor([-0.0, 0.0, -1.5])
    logp[1, [1099, 3]] = torch.tensor([0.0, -0.0])
    check(logp, 6)


def test_merge_levels_until_one_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """Leaves of LEAF_CHUNK tokens, then merges of MERGE_CHUNK winners until one list; with
    small chunks a case with two levels of merges runs end to end."""
    assert vocab_topk.levels(49152, 16) == [(96, 512), (1, 2048)]
    assert vocab_topk.levels(49152, 63) == [(96, 512), (3, 2048), (1, 256)]
    assert vocab_topk.levels(151936, 64)[-1][0] == 1
    monkeypatch.setattr(vocab_topk, "LEAF_CHUNK", 64)
    monkeypatch.setattr(vocab_topk, "MERGE_CHUNK", 128)
    assert vocab_topk.levels(3000, 16) == [(47, 64), (6, 128), (1, 128)]
    gen = torch.Generator().manual_seed(3)
    check(torch.log_softmax(torch.randn(1, 3000, generator=gen), dim=-1), 16)


def test_supports() -> None:
    assert vocab_topk.supports(49152, 63)
    assert not vocab_topk.supports(49152, 0)
    assert not vocab_topk.supports(10, 11)
    assert vocab_topk.supports(151936, vocab_topk.MAX_K)
    assert not vocab_topk.supports(151936, vocab_topk.MAX_K + 1)


def test_the_round_tree_builds_on_it() -> None:
    """build_round_tree with kernels: the vocabulary top-K (with its log-sum-exp) and the
    tree build in Triton give the PyTorch round tree: the same nodes, their scores to
    float32 rounding (another log-sum-exp); with torch's log-sum-exp beside the kernels
    (`set_fused_lse(False)`) bitwise."""
    gen = torch.Generator().manual_seed(5)
    logits = 3 * torch.randn(3, 2, 700, generator=gen)
    bonus, budget = torch.tensor([1, 2, 3]), torch.tensor([16, 6, 0])
    force, max_topk = torch.tensor([False, True, False]), torch.tensor([0, 0, 0])
    want = build_round_tree(logits, bonus, 16, budget, force, max_topk)
    got = build_round_tree(logits, bonus, 16, budget, force, max_topk, kernels=True)
    for name in ("tokens", "parents", "depth", "valid"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    torch.testing.assert_close(got.scores, want.scores, rtol=1e-6, atol=1e-6)
    before = set_fused_lse(False)
    try:
        got = build_round_tree(logits, bonus, 16, budget, force, max_topk, kernels=True)
    finally:
        set_fused_lse(before)
    for name in ("tokens", "parents", "depth", "valid", "scores"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name


def test_the_default_shape_follows_k_and_the_rows_and_gives_the_same_tokens() -> None:
    """SHAPES picks the tournament's shape by K and the rows it ranks (set_shapes(False):
    the one-warp 512-token shape everywhere); each gives torch's tokens."""
    assert vocab_topk.shape(16, 15) == (512, (1, 4))
    assert vocab_topk.shape(63, 15) == (1024, (2, 4))
    assert vocab_topk.shape(63, 120) == (512, (1, 4))
    assert vocab_topk.shape(32, 120) == (512, (1, 1))  # no entry holds: the default
    assert vocab_topk.shape(5, 1) == (512, (1, 1))
    before = vocab_topk.set_shapes(False)
    try:
        assert vocab_topk.shape(63, 15) == (512, (1, 1))
    finally:
        vocab_topk.set_shapes(before)
    gen = torch.Generator().manual_seed(7)
    logits = torch.randint(0, 6, (3, 5000), generator=gen).float()
    logp = torch.log_softmax(logits, dim=-1)
    for k in (16, 32, 63):  # one or two merge levels under the shapes picked
        assert torch.equal(vocab_topk.stable_topk(logp, k), _stable_topk(logp, k)), k
