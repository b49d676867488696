"""The one-kernel tree build gives `build_round_tree`'s PyTorch trees bitwise (over the same
log-sum-exp): tokens,
parents, depths, validity and scores, for mixed rows (ar, chains, trees of several budgets,
shadows, branching caps) in one batch, with many exact ties (integer logits) and without,
and when the vocabulary is smaller than the tree."""

from __future__ import annotations

import pytest
import torch

from ddtree.kernels import tree_build
from ddtree.tree import _beam_widths, build_round_tree


def rows(batch: int, depth: int, num_nodes: int) -> tuple[torch.Tensor, ...]:
    """Per row: budget, force_chain, max_topk cycling through ar, chain, tree, shadow and
    a capped tree."""
    kinds = [(0, False, 0), (depth, True, 0), (num_nodes, False, 0),
             (num_nodes, True, 0), (max(1, num_nodes // 2), False, 2), (num_nodes, False, 3)]
    chosen = [kinds[i % len(kinds)] for i in range(batch)]
    budget = torch.tensor([min(b, num_nodes) for b, _, _ in chosen])
    force = torch.tensor([f and depth <= num_nodes for _, f, _ in chosen])
    max_topk = torch.tensor([k for _, _, k in chosen])
    return budget, force, max_topk


def check(logits: torch.Tensor, num_nodes: int) -> None:
    batch, depth, _ = logits.shape
    bonus = torch.arange(batch) + 7
    budget, force, max_topk = rows(batch, depth, num_nodes)
    expected = build_round_tree(logits, bonus, num_nodes, budget, force, max_topk)
    # torch's top-K and log-sum-exp on both sides: the same log-probabilities in
    # (the vocabulary kernels' own log-sum-exp differs by float32 rounding:
    # tests/kernels/test_vocab_topk.py)
    got = build_round_tree(logits, bonus, num_nodes, budget, force, max_topk, kernels=True,
                           topk_kernel=False)
    for name in ("tokens", "parents", "depth", "valid", "scores"):
        want, have = getattr(expected, name), getattr(got, name)
        assert have.dtype == want.dtype and have.shape == want.shape, name
        assert torch.equal(have, want), f"{name} differs:\n{have}\n{want}"


@pytest.mark.parametrize(("num_nodes", "depth"), [(16, 15), (32, 6)])
def test_random_logits(num_nodes: int, depth: int) -> None:
    gen = torch.Generator().manual_seed(num_nodes)
    check(3 * torch.randn(6, depth, 500, generator=gen), num_nodes)


def test_integer_logits_tie_often() -> None:
    """Equal logits give equal log-probabilities and equal prefix sums: every order rule
    (lower token id, shallower prefix, earlier beam position) decides somewhere."""
    gen = torch.Generator().manual_seed(0)
    check(torch.randint(0, 3, (6, 7, 40), generator=gen).float(), 24)


def test_vocabulary_smaller_than_the_tree() -> None:
    gen = torch.Generator().manual_seed(1)
    check(torch.randn(3, 4, 6, generator=gen), 20)


def test_supports_says_when_the_union_is_too_small() -> None:
    assert tree_build.supports(64, 64, _beam_widths(64, 64, 15))
    assert not tree_build.supports(20, 2, _beam_widths(20, 2, 2))  # 2 + 4 prefixes < 20


def test_the_top_w_selection_gives_the_full_sorts_trees() -> None:
    """Each depth's beam from a bitonic top-W of its candidate keys (the default) or from
    a full sort of them: the same trees, bitwise (64 candidates of 4 ranks -> beams of 16,
    many exact ties)."""
    gen = torch.Generator().manual_seed(3)
    batch, depth, num_nodes = 4, 5, 16
    logits = torch.randint(0, 4, (batch, depth, 300), generator=gen).float()
    logits[:2] = 2 * torch.randn(2, depth, 300, generator=gen)
    lse = torch.logsumexp(logits, dim=-1)
    ranks = logits.topk(num_nodes, dim=-1).indices
    widths = _beam_widths(num_nodes, num_nodes, depth)
    bonus, budget, force, max_topk = (torch.arange(batch), torch.full((batch,), num_nodes),
                                      torch.tensor([False, True, False, True]),
                                      torch.tensor([0, 0, 3, 0]))
    topk = tree_build.tree_from_ranks(logits, lse, ranks, bonus, widths, num_nodes, budget,
                                      force, max_topk)
    sort = tree_build.tree_from_ranks(logits, lse, ranks, bonus, widths, num_nodes, budget,
                                      force, max_topk, select_topk=False)
    for mine, theirs in zip(topk, sort, strict=True):
        assert torch.equal(mine, theirs)
