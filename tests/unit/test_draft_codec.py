"""The Draft stream's batched messages (wire versions 2-3): a round's rows and trees
round-trip through DraftBatch / DraftTrees, and malformed ones fail with a clear typed
error before anything is trusted; segment_rows finds each row's features in the packed
tensor."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from ddtree import draft_codec
from ddtree.draft_codec import DraftedTrees
from ddtree.engine import SpecParams
from ddtree.engine.draft_graphs import segment_rows
from ddtree.errors import InvalidArgumentError, TreeValidationError
from ddtree.v1 import drafter_pb2

WIDTH = 6  # k*H


def batch(num_features: list[int], dtype: torch.dtype = torch.bfloat16) -> drafter_pb2.DraftBatch:
    features = torch.randn(sum(num_features), WIDTH).to(dtype)
    return draft_codec.draft_batch_to_proto(
        [f"s{r}" for r in range(len(num_features))], [10 + r for r in range(len(num_features))],
        [3 + r for r in range(len(num_features))], features, num_features,
        {1: SpecParams("tree", 8)})


def test_a_batch_round_trips_with_each_rows_features_in_order() -> None:
    features = torch.randn(5, WIDTH)
    msg = draft_codec.draft_batch_to_proto(["a", "b", "c"], [4, 9, 2], [1, 2, 3], features,
                                           [2, 0, 3], {1: SpecParams("linear", 4)})
    decoded = draft_codec.draft_round_from_proto(msg, WIDTH)
    assert decoded.session_ids == ["a", "b", "c"]
    assert decoded.committed_len.tolist() == [4, 9, 2]
    assert decoded.bonus_token.tolist() == [1, 2, 3]
    assert decoded.feature_starts.tolist() == [0, 2, 2]
    assert torch.equal(decoded.features, features)
    assert list(decoded.specs) == [1] and decoded.specs[1].budget == 4
    assert decoded.num_nodes is None and decoded.force_chain is None  # the specs decide


def test_each_rows_tree_of_the_round_round_trips() -> None:
    """Wire version 3: an auto row's tree size changes from round to round."""
    msg = draft_codec.draft_batch_to_proto(["a", "b"], [4, 9], [1, 2], torch.randn(2, WIDTH),
                                           [1, 1], {}, num_nodes=[7, 32],
                                           force_chain=[True, False])
    decoded = draft_codec.draft_round_from_proto(msg, WIDTH)
    assert decoded.num_nodes is not None and decoded.force_chain is not None
    assert decoded.num_nodes.tolist() == [7, 32]
    assert decoded.force_chain.tolist() == [True, False]


@pytest.mark.parametrize("change, words", [
    (lambda m: m.committed_len.append(1), "committed_len / bonus_token / num_features"),
    (lambda m: m.num_features.__setitem__(0, 3), "shape [5, 6], expected [6, 6]"),
    (lambda m: m.num_features.__setitem__(0, -1), "num_features must be >= 0"),
    (lambda m: m.specs[7].CopyFrom(m.specs[1]), "rows [7] outside [0, 2)"),
    (lambda m: m.num_nodes.append(8), "num_nodes / force_chain have 1 / 0"),
])
def test_a_malformed_batch_is_invalid_argument(change, words: str) -> None:  # noqa: ANN001
    msg = batch([2, 3])
    change(msg)
    with pytest.raises(InvalidArgumentError, match=re.escape(words)):
        draft_codec.draft_round_from_proto(msg, WIDTH)


def test_features_of_the_wrong_width_or_dtype_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="k\\*H"):
        draft_codec.draft_round_from_proto(batch([2]), WIDTH + 1)
    with pytest.raises(InvalidArgumentError, match="not floating point"):
        draft_codec.draft_round_from_proto(batch([2], torch.int32), WIDTH)


def trees(num_nodes: list[int], width: int = 4) -> DraftedTrees:
    tokens = np.arange(len(num_nodes) * width).reshape(len(num_nodes), width)
    parents = np.tile(np.arange(-1, width - 1), (len(num_nodes), 1))
    return DraftedTrees(tokens, parents, np.array(num_nodes), np.array([5] * len(num_nodes)),
                        {2: ("unknown session 'x'", "NOT_FOUND")} if len(num_nodes) > 2 else {})


def test_trees_round_trip_trimmed_to_the_largest_tree() -> None:
    sent = trees([3, 2, 0])
    msg = draft_codec.draft_trees_to_proto(sent)
    assert list(msg.tokens.shape) == [3, 3]  # W = max(num_nodes)
    got = draft_codec.draft_trees_from_proto(msg, num_rows=3, max_width=4)
    assert np.array_equal(got.tokens, sent.tokens[:, :3])
    assert np.array_equal(got.parents, sent.parents[:, :3])
    assert got.num_nodes.tolist() == [3, 2, 0] and got.committed_len.tolist() == [5, 5, 5]
    assert got.errors == {2: ("unknown session 'x'", "NOT_FOUND")}


def test_malformed_trees_are_tree_validation_errors() -> None:
    msg = draft_codec.draft_trees_to_proto(trees([4, 2]))
    with pytest.raises(TreeValidationError, match="for a batch of 3 rows"):
        draft_codec.draft_trees_from_proto(msg, num_rows=3, max_width=4)
    with pytest.raises(TreeValidationError, match=r"expected \[2, 1..3\]"):
        draft_codec.draft_trees_from_proto(msg, num_rows=2, max_width=3)
    msg.num_nodes[0] = 5
    with pytest.raises(TreeValidationError, match=r"num_nodes outside \[0, 4\]"):
        draft_codec.draft_trees_from_proto(msg, num_rows=2, max_width=4)
    msg = draft_codec.draft_trees_to_proto(trees([4, 2]))
    msg.errors.add(row=9, error="?", error_code="INTERNAL")
    with pytest.raises(TreeValidationError, match="error for row 9"):
        draft_codec.draft_trees_from_proto(msg, num_rows=2, max_width=4)


def test_segment_rows_lists_each_rows_segment_in_row_order() -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):
        num_rows = int(rng.integers(0, 6))
        starts, counts = rng.integers(0, 50, num_rows), rng.integers(0, 5, num_rows)
        expected = [s + j for s, c in zip(starts.tolist(), counts.tolist(), strict=True)
                    for j in range(c)]
        got = segment_rows(starts, counts)
        assert got.dtype == np.int64 and got.tolist() == expected
