"""ddtree.tree: build_tree equals the best-first heap (tests/unit/heap_reference.py) node for
node, also on exact ties; the tree invariants; round trees, ancestor chains, depths; and
validate_tree's rejection of every malformed tree a client could send, and invalid_rows'
diagnosis of each malformed row of a padded batch (the drafter's trees)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from ddtree.errors import InvalidArgumentError, TreeValidationError
from ddtree.tree import (
    DraftTree,
    ancestor_chains,
    build_round_tree,
    build_tree,
    depths_from_parents,
)
from ddtree.tree_validation import check_rows, invalid_rows, validate_tree
from tests.unit.heap_reference import heap_tree, ranked_tokens


def prefixes(tree: DraftTree, row: int) -> list[tuple[int, ...]]:
    """Token prefix (root excluded) of every node 1..N of one row."""
    tokens, parents = tree.tokens[row].tolist(), tree.parents[row].tolist()
    found: list[tuple[int, ...]] = [()]
    for i in range(1, len(tokens)):
        found.append(found[parents[i]] + (tokens[i],))
    return found[1:]


def assert_matches_heap(logits: torch.Tensor, budget: int, max_topk: int | None = None) -> None:
    """build_tree on logits (B, L, V) == the heap, row by row: same nodes, order, scores."""
    bonus = torch.arange(logits.shape[0]) + 3
    tree = build_tree(logits, bonus, budget, max_topk)
    logp = torch.log_softmax(logits.float(), dim=-1)
    assert_invariants(tree, bonus, logp, budget)
    for row in range(logits.shape[0]):
        expected = heap_tree(logits[row].float(), budget, max_topk)
        got = prefixes(tree, row)
        assert set(got) == {prefix for prefix, _ in expected}
        assert got == [prefix for prefix, _ in expected]
        assert tree.scores[row, 1:].tolist() == [score for _, score in expected]


def assert_invariants(tree: DraftTree, bonus: torch.Tensor, logp: torch.Tensor,
                      budget: int) -> None:
    batch = bonus.shape[0]
    for field in (tree.tokens, tree.parents, tree.depth):
        assert field.shape == (batch, 1 + budget) and field.dtype == torch.int64
    assert tree.num_nodes == budget
    assert torch.equal(tree.tokens[:, 0], bonus)
    assert (tree.parents[:, 0] == -1).all() and (tree.depth[:, 0] == 0).all()
    index = torch.arange(1, budget + 1)
    assert ((tree.parents[:, 1:] >= 0) & (tree.parents[:, 1:] < index)).all()
    assert torch.equal(tree.depth, depths_from_parents(tree.parents))
    assert torch.equal(tree.depth[:, 1:], tree.depth.gather(1, tree.parents[:, 1:]) + 1)
    for row in range(batch):
        parents, scores = tree.parents[row].tolist(), tree.scores[row].tolist()
        order = [(-scores[i], tree.depth[row, i].item()) for i in range(1, budget + 1)]
        assert order == sorted(order), "nodes by decreasing score, then shallower first"
        for i in range(1, budget + 1):
            depth = tree.depth[row, i].item()
            step = logp[row, depth - 1, tree.tokens[row, i]].item()
            assert scores[i] == pytest.approx(scores[parents[i]] + step, abs=1e-5)
            siblings = [j for j in range(1, budget + 1) if parents[j] == parents[i]]
            step_of = [logp[row, depth - 1, tree.tokens[row, j]].item() for j in siblings]
            assert step_of == sorted(step_of, reverse=True), "children by decreasing prob"


RANDOM_CASES = [  # (L, V, budget, max_topk)
    (1, 5, 3, None), (2, 4, 10, None), (3, 6, 20, None), (4, 3, 30, 2), (5, 8, 40, 3),
    (3, 50, 32, None), (6, 2, 60, None), (2, 7, 49, None), (4, 10, 4, 1), (3, 5, 1, None),
    (6, 3, 25, 3),
]


@pytest.mark.parametrize("case", RANDOM_CASES)
def test_build_tree_equals_heap_on_random_distributions(case: tuple) -> None:
    num_levels, vocab, budget, max_topk = case
    for seed in range(12):
        gen = torch.Generator().manual_seed(seed)
        scale = (0.5, 1.0, 3.0)[seed % 3]
        logits = torch.randn(3, num_levels, vocab, generator=gen) * scale
        assert_matches_heap(logits, budget, max_topk)


@pytest.mark.parametrize("case", RANDOM_CASES)
def test_build_tree_equals_heap_on_peaked_distributions(case: tuple) -> None:
    num_levels, vocab, budget, max_topk = case
    for seed in range(6):
        gen = torch.Generator().manual_seed(100 + seed)
        logits = torch.randn(2, num_levels, vocab, generator=gen) * 12
        assert_matches_heap(logits, budget, max_topk)


@pytest.mark.parametrize("case", RANDOM_CASES)
def test_build_tree_equals_heap_with_exact_ties(case: tuple) -> None:
    # Integer logits repeat values within a depth, and equal float32 sums across parents.
    num_levels, vocab, budget, max_topk = case
    for seed in range(8):
        gen = torch.Generator().manual_seed(200 + seed)
        logits = torch.randint(0, 3, (2, num_levels, vocab), generator=gen).float()
        assert_matches_heap(logits, budget, max_topk)
        assert_matches_heap(torch.zeros(1, num_levels, vocab), budget, max_topk)  # uniform


def one_hot_depth_logits(num_levels: int, vocab: int, hot_level: int, seed: int) -> torch.Tensor:
    """(1, L, V) random logits; depth hot_level puts probability exactly 1 (log-prob 0.0)
    on one token: the rest sit at <= -200, whose exp underflows to 0 in float32."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, num_levels, vocab, generator=gen)
    logits[0, hot_level] = -200.0 - torch.randperm(vocab, generator=gen).float()
    logits[0, hot_level, seed % vocab] = 0.0
    return logits


@pytest.mark.parametrize("hot_level", [0, 1, 2])
def test_one_hot_depth_children_tie_their_parents_and_stay_after_them(hot_level: int) -> None:
    for seed in range(10):
        logits = one_hot_depth_logits(4, 5, hot_level, seed)
        assert torch.log_softmax(logits, -1)[0, hot_level].max().item() == 0.0
        assert_matches_heap(logits, 12)
        tree = build_tree(logits, torch.tensor([0]), 12)
        scores, parents = tree.scores[0], tree.parents[0]
        ties = (scores[1:] == scores[parents[1:]]).nonzero()
        if hot_level > 0:
            assert ties.numel() > 0, "a probability-1 token makes a child tie its parent"


def test_budget_one_is_the_top_token_of_depth_one() -> None:
    logits = torch.randn(4, 3, 9, generator=torch.Generator().manual_seed(5))
    tree = build_tree(logits, torch.zeros(4, dtype=torch.long), 1)
    assert tree.tokens.shape == (4, 2)
    assert torch.equal(tree.tokens[:, 1], logits[:, 0].argmax(-1))
    assert torch.equal(tree.parents, torch.tensor([[-1, 0]] * 4))


@pytest.mark.parametrize(("num_levels", "vocab", "max_topk"), [(3, 3, None), (2, 5, 3), (4, 2, 2)])
def test_budget_at_and_near_the_number_of_prefixes(num_levels: int, vocab: int,
                                                   max_topk: int | None) -> None:
    num_ranks = min(vocab, max_topk or vocab)
    total = sum(num_ranks**d for d in range(1, num_levels + 1))
    logits = torch.randn(2, num_levels, vocab, generator=torch.Generator().manual_seed(9))
    for budget in (total - 1, total):
        assert_matches_heap(logits, budget, max_topk)
    tree = build_tree(logits, torch.zeros(2, dtype=torch.long), total, max_topk)
    ranked = ranked_tokens(torch.log_softmax(logits[0], -1), num_ranks)
    assert set(prefixes(tree, 0)) == {
        prefix for depth in range(1, num_levels + 1)
        for prefix in itertools.product(*ranked[:depth])
    }
    with pytest.raises(InvalidArgumentError, match=f"budget {total + 1} exceeds the {total}"):
        build_tree(logits, torch.zeros(2, dtype=torch.long), total + 1, max_topk)


def test_build_tree_is_the_optimum_by_brute_force() -> None:
    """Independent of tie-breaking: the chosen scores are the top-N of all prefixes."""
    for seed in range(20):
        gen = torch.Generator().manual_seed(300 + seed)
        logits = torch.randn(1, 3, 4, generator=gen) * 2
        logp = torch.log_softmax(logits, -1)[0].double()
        every = sorted((sum(logp[d, t].item() for d, t in enumerate(prefix))
                        for depth in (1, 2, 3) for prefix in itertools.product(range(4),
                                                                               repeat=depth)),
                       reverse=True)
        budget = 1 + seed * 4
        tree = build_tree(logits, torch.zeros(1, dtype=torch.long), budget)
        np.testing.assert_allclose(tree.scores[0, 1:].double().numpy(), every[:budget], atol=1e-5)


def test_max_topk_caps_the_tokens_of_every_depth() -> None:
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(2, 4, 12, generator=gen) * 0.3  # flat: would branch widely
    for max_topk in (2, 3, 5):
        tree = build_tree(logits, torch.zeros(2, dtype=torch.long), 30, max_topk)
        logp = torch.log_softmax(logits, -1)
        for row in range(2):
            allowed = ranked_tokens(logp[row], max_topk)
            for i in range(1, 31):
                depth = tree.depth[row, i].item()
                assert tree.tokens[row, i].item() in allowed[depth - 1]
            children = torch.bincount(tree.parents[row, 1:], minlength=31)
            assert children.max().item() <= max_topk
    chain = build_tree(logits, torch.zeros(2, dtype=torch.long), 4, 1)
    assert torch.equal(chain.parents, torch.tensor([[-1, 0, 1, 2, 3]] * 2))
    assert torch.equal(chain.tokens[:, 1:], logits.argmax(-1))


def test_batch_rows_are_independent() -> None:
    gen = torch.Generator().manual_seed(12)
    logits = torch.randn(5, 3, 7, generator=gen) * torch.tensor([0.1, 1, 3, 8, 0])[:, None, None]
    bonus = torch.tensor([1, 2, 3, 4, 5])
    tree = build_tree(logits, bonus, 17, 5)
    for row in range(5):
        alone = build_tree(logits[row:row + 1], bonus[row:row + 1], 17, 5)
        for name in ("tokens", "parents", "depth", "scores"):
            assert torch.equal(getattr(tree, name)[row], getattr(alone, name)[0])


def test_lowest_index_child_is_the_rank_zero_child() -> None:
    gen = torch.Generator().manual_seed(13)
    logits = torch.randn(1, 4, 6, generator=gen)
    tree = build_tree(logits, torch.zeros(1, dtype=torch.long), 40)
    top = logits[0].argmax(-1)
    parents = tree.parents[0].tolist()
    for node in range(41):
        children = [i for i in range(1, 41) if parents[i] == node]
        if children:
            assert tree.tokens[0, children[0]].item() == top[tree.depth[0, node]].item()


@pytest.mark.parametrize(("budget", "max_topk", "match"), [
    (0, None, "budget must be an integer >= 1"), (-3, None, "budget"),
    (2.5, None, "budget"), (4, 0, "max_topk must be None or an integer >= 1"),
])
def test_build_tree_rejects_bad_arguments(budget: int, max_topk: int | None, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        build_tree(torch.randn(1, 3, 5), torch.zeros(1, dtype=torch.long), budget, max_topk)


def test_budget_check_copes_with_huge_prefix_counts() -> None:
    # K^L = 1000^64 is never formed: widths are capped at the budget.
    tree = build_tree(torch.randn(1, 64, 1000), torch.zeros(1, dtype=torch.long), 5, 1000)
    assert tree.num_nodes == 5
    with pytest.raises(InvalidArgumentError, match="exceeds the 0 distinct"):
        build_tree(torch.randn(1, 0, 5), torch.zeros(1, dtype=torch.long), 1)


def test_build_tree_and_walk_never_read_tensor_values_on_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ddtree.acceptance import walk
    from ddtree.sampling import RowSampling

    logits = torch.randn(2, 4, 9)
    bonus = torch.tensor([1, 2])
    target_logits = torch.randn(2, 21, 9)

    def sync(*args: object, **kwargs: object) -> None:
        raise AssertionError("host sync")

    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "nonzero", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, sync)
    monkeypatch.setattr(torch, "nonzero", sync)
    tree = build_tree(logits, bonus, 20, 4)
    counter, first_child = torch.tensor([5, 9]), torch.tensor([False, True])
    greedy = RowSampling(torch.zeros(2), torch.zeros(2, dtype=torch.long), torch.ones(2),
                         torch.tensor([1, 2]), any_sampled=False, any_filtered=False)
    mixed = RowSampling(torch.tensor([0.0, 0.8]), torch.tensor([0, 5]),
                        torch.tensor([1.0, 0.9]), torch.tensor([1, 2]), any_sampled=True,
                        any_filtered=True)
    walk(tree, target_logits, greedy, counter, first_child, 20)
    walk(tree, target_logits, mixed, counter, first_child, 4)
    round_tree = build_round_tree(logits, bonus, 20, torch.tensor([20, 4]),
                                  torch.tensor([True, False]), torch.tensor([0, 3]))
    walk(round_tree, target_logits, mixed, counter, first_child, 4)
    depths_from_parents(tree.parents)
    monkeypatch.undo()
    assert tree.num_nodes == 20


# ---------------------------------------------------------------------------- structure


def naive_ancestors(parents: list[int]) -> torch.Tensor:
    mask = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for i in range(len(parents)):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


def test_depths_from_parents_count_each_nodes_ancestors() -> None:
    gen = torch.Generator().manual_seed(14)
    for num_rows in (1, 2, 3, 7, 16, 33, 100):
        rows = [[-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, num_rows)]
                for _ in range(3)]
        parents = torch.tensor(rows)
        expected = torch.stack([naive_ancestors(row).sum(-1) - 1 for row in rows])
        assert torch.equal(depths_from_parents(parents), expected)
        assert torch.equal(depths_from_parents(parents[0]), expected[0])


# ---------------------------------------------------------------------------- validation


VALID_TOKENS = [7, 1, 2, 3, 1, 4]
VALID_PARENTS = [-1, 0, 0, 1, 2, 2]
TOKENS, PARENTS = torch.tensor(VALID_TOKENS), torch.tensor(VALID_PARENTS)
EMPTY = torch.tensor([], dtype=torch.long)


def test_validate_tree_accepts_valid_trees() -> None:
    validate_tree(TOKENS, PARENTS, vocab_size=8, max_nodes=5)
    validate_tree(TOKENS[None].int(), PARENTS[None].int(), vocab_size=8, max_nodes=5, max_depth=2)
    validate_tree(torch.tensor([0]), torch.tensor([-1]), vocab_size=1, max_nodes=0)
    tree = build_tree(torch.randn(3, 4, 10), torch.tensor([1, 2, 3]), 30)
    validate_tree(tree.tokens, tree.parents, vocab_size=10, max_nodes=30, max_depth=4)


def edit(values: list[int], index: int, value: int) -> torch.Tensor:
    changed = list(values)
    changed[index] = value
    return torch.tensor(changed)


@pytest.mark.parametrize(("tokens", "parents", "match"), [
    (TOKENS, edit(VALID_PARENTS, 3, 4), r"parents\[3\] = 4 must be a node before 3"),
    (TOKENS, edit(VALID_PARENTS, 2, 2), r"parents\[2\] = 2"),  # a self loop
    (TOKENS, torch.tensor([-1, 2, 1, 1, 2, 2]), r"parents\[1\] = 2"),  # a 1 <-> 2 cycle
    (TOKENS, edit(VALID_PARENTS, 4, -1), r"parents\[4\] = -1"),  # a second root
    (TOKENS, edit(VALID_PARENTS, 5, -7), r"parents\[5\] = -7"),
    (TOKENS, edit(VALID_PARENTS, 0, 0), r"parents\[0\] = 0 must be -1"),
    (edit(VALID_TOKENS, 3, 8), PARENTS, r"tokens\[3\] = 8 is outside .*\[0, 8\)"),
    (edit(VALID_TOKENS, 2, -1), PARENTS, r"tokens\[2\] = -1"),
    (edit(VALID_TOKENS, 5, 1), PARENTS, "nodes 4 and 5 are siblings with the same token 1"),
    (edit(VALID_TOKENS, 2, 1), PARENTS, "nodes 1 and 2 are siblings"),
    (TOKENS.float(), PARENTS, "tokens must have an integer dtype"),
    (TOKENS, PARENTS.double(), "parents must have an integer dtype"),
    (TOKENS.bool(), PARENTS, "integer dtype"),
    (TOKENS[:5], PARENTS, r"tokens shape \[5\] != parents shape \[6\]"),
    (TOKENS[None], PARENTS, "shape"),
    (EMPTY, EMPTY, r"expected \[1\+N\]"),
    (TOKENS[None, None], PARENTS[None, None], "shape"),
    (torch.arange(7), torch.arange(-1, 6), "6 nodes besides the root exceed max_nodes 5"),
    (VALID_TOKENS, PARENTS, "tokens must be a tensor"),
])
def test_validate_tree_rejects_malformed_trees(
    tokens: torch.Tensor, parents: torch.Tensor, match: str
) -> None:
    with pytest.raises(TreeValidationError, match=match):
        validate_tree(tokens, parents, vocab_size=8, max_nodes=5)


def test_validate_tree_names_the_row_and_checks_depth() -> None:
    tokens = torch.tensor([VALID_TOKENS, VALID_TOKENS])
    parents = torch.tensor([VALID_PARENTS, edit(VALID_PARENTS, 5, 9).tolist()])
    with pytest.raises(TreeValidationError, match=r"tree row 1: parents\[5\] = 9"):
        validate_tree(tokens, parents, vocab_size=8, max_nodes=5)
    with pytest.raises(TreeValidationError, match="node 3 has depth 2 > max_depth 1"):
        validate_tree(torch.tensor(VALID_TOKENS), torch.tensor(VALID_PARENTS), 8, 5, max_depth=1)


def test_ancestor_chains_list_each_nodes_ancestors_by_depth() -> None:
    gen = torch.Generator().manual_seed(0)
    for trial in range(50):
        num_nodes = int(torch.randint(1, 40, (1,), generator=gen))
        parents = torch.full((3, num_nodes), -1)
        for i in range(1, num_nodes):
            parents[:, i] = torch.randint(0, i, (3,), generator=gen)
        depth = depths_from_parents(parents)
        width = int(depth.max()) + 1 + trial % 3
        got_depth, chains = ancestor_chains(parents, width)
        assert torch.equal(got_depth, depth)
        for b in range(3):
            for i in range(num_nodes):
                chain, node = [], i
                while node >= 0:
                    chain.append(node)
                    node = int(parents[b, node])
                expected = chain[::-1] + [0] * (width - len(chain))
                assert chains[b, i].tolist() == expected, (trial, b, i)


def padded(rows: list[tuple[list[int], list[int]]], width: int) -> tuple[torch.Tensor, ...]:
    """(tokens, parents) rows padded to `width` with junk, and their node counts."""
    tokens = torch.full((len(rows), width), 99)
    parents = torch.full((len(rows), width), 77)
    for b, (t, p) in enumerate(rows):
        tokens[b, : len(t)], parents[b, : len(p)] = torch.tensor(t), torch.tensor(p)
    return tokens, parents, torch.tensor([len(t) for t, _ in rows])


def test_invalid_rows_names_each_bad_row_as_validate_tree_would() -> None:
    bad = [
        (VALID_TOKENS, edit(VALID_PARENTS, 0, 0).tolist()),
        (VALID_TOKENS, edit(VALID_PARENTS, 3, 3).tolist()),
        (edit(VALID_TOKENS, 2, 8).tolist(), VALID_PARENTS),
        (edit(VALID_TOKENS, 5, 1).tolist(), VALID_PARENTS),
    ]
    rows = [(VALID_TOKENS, VALID_PARENTS), *bad, ([7], [-1]), (VALID_TOKENS[:4], VALID_PARENTS[:4])]
    tokens, parents, num_nodes = padded(rows, 8)
    problems = invalid_rows(tokens, parents, num_nodes, vocab_size=8, max_depth=4)
    assert sorted(problems) == [1, 2, 3, 4]  # the padding of the good rows is never read
    for b, (t, p) in enumerate(bad, start=1):
        with pytest.raises(TreeValidationError) as info:
            validate_tree(torch.tensor(t), torch.tensor(p), vocab_size=8, max_nodes=5)
        assert problems[b] == str(info.value)
    assert "parents[0] = 0" in problems[1] and "parents[3] = 3" in problems[2]
    assert "tokens[2] = 8" in problems[3] and "nodes 4 and 5 are siblings" in problems[4]


def test_invalid_rows_checks_depth_and_accepts_good_batches() -> None:
    chain = (list(range(6)), [-1, 0, 1, 2, 3, 4])
    tokens, parents, num_nodes = padded([chain, (VALID_TOKENS, VALID_PARENTS)], 6)
    problems = invalid_rows(tokens, parents, num_nodes, vocab_size=8, max_depth=3)
    assert problems == {0: "tree: node 4 has depth 4 > max_depth 3"}
    assert invalid_rows(tokens, parents, num_nodes, vocab_size=8, max_depth=5) == {}


def test_invalid_rows_agrees_with_validate_tree_on_random_batches() -> None:
    """The batched screen flags exactly the rows validate_tree refuses, with its words, and
    gives the good rows' depths (padding at depth 1)."""
    gen = np.random.default_rng(0)
    for trial in range(200):
        num_rows, width, vocab = int(gen.integers(1, 9)), int(gen.integers(1, 12)), 6
        tokens = gen.integers(-2, vocab + 2, (num_rows, width))  # junk padding
        parents = gen.integers(-2, width + 2, (num_rows, width))
        num_nodes = gen.integers(1, width + 1, num_rows)
        for b in range(num_rows):
            if gen.random() < 0.6:  # a well-formed tree, maybe with one flaw
                parents[b, 0] = -1
                for i in range(1, num_nodes[b]):
                    parents[b, i] = gen.integers(0, i)
                    tokens[b, i] = gen.integers(0, vocab)
                tokens[b, 0] = gen.integers(0, vocab)
        max_depth = int(gen.integers(1, 5))
        checked = check_rows(tokens, parents, num_nodes, vocab, max_depth)
        for b in range(num_rows):
            n = int(num_nodes[b])
            try:
                validate_tree(torch.tensor(tokens[b, :n]), torch.tensor(parents[b, :n]), vocab,
                              width, max_depth)
            except TreeValidationError as exc:
                assert checked.problems.get(b) == str(exc), (trial, b)
                continue
            assert b not in checked.problems, (trial, b)
            depth = depths_from_parents(torch.tensor(parents[b, :n])).tolist()
            assert checked.depth[b].tolist() == depth + [1] * (width - n), (trial, b)
            assert checked.real[b].tolist() == [True] * n + [False] * (width - n)
