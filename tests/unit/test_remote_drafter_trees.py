"""The verifier's checks of the drafter's trees (RemoteDrafter): every row of a round is
checked at once, a bad tree (a drafter error, stale, too big, malformed, wrong root) is
refused with a reason naming what was wrong and its row continues in ar, the good rows'
trees land in the round's staged buffers with their depths. Trees a real drafter never
sends are built here as the messages it would send."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from ddtree import draft_codec
from ddtree.draft_codec import DraftedTrees
from ddtree.engine import GenerationRequest, SpecParams
from ddtree.engine.rows import Row
from ddtree.stats import GenerationStats
from ddtree.v1 import drafter_pb2
from verifier_svc.drafter_client import DrafterClient
from verifier_svc.remote_drafter import (
    DEPTH,
    MIN_DEADLINE_S,
    PARENTS,
    TOKENS,
    VALID,
    RemoteDrafter,
    _Staging,
)

VOCAB, BLOCK, NODES = 16, 4, 4  # depth L = 3; buffers of 1 + 4 nodes
GOOD_TOKENS, GOOD_PARENTS = [5, 1, 2, 3], [-1, 0, 0, 1]


@pytest.fixture()
def drafter() -> Iterator[RemoteDrafter]:
    # Never connected: a row that stops drafting has nothing to release on the wire.
    client = DrafterClient("127.0.0.1:9", 1.0, 1.0)
    info = drafter_pb2.DrafterInfo(block_size=BLOCK, target_layer_ids=[1], hidden_size=8,
                                   vocab_size=VOCAB)
    yield RemoteDrafter(client, info, 1.0)
    client.close()


def row(index: int, num_nodes: int = NODES) -> Row:
    request = GenerationRequest([1, 2, 3], 10, spec=SpecParams("tree", num_nodes))
    return Row(f"r{index}", request, num_nodes, frozenset(), 0, GenerationStats("tree", num_nodes),
               slot=index, committed_len=7, bonus_token=5, drafting=True)


def reply(trees: list[tuple[list[int], list[int]]], committed: list[int] | None = None,
          errors: dict[int, tuple[str, str]] | None = None) -> drafter_pb2.DraftTrees:
    width = max(len(t) for t, _ in trees)
    tokens, parents = np.zeros((len(trees), width), np.int64), np.zeros((len(trees), width),
                                                                         np.int64)
    for b, (t, p) in enumerate(trees):
        tokens[b, : len(t)], parents[b, : len(p)] = t, p
    num_nodes = np.array([0 if errors and b in errors else len(t) for b, (t, _) in
                          enumerate(trees)])
    return draft_codec.draft_trees_to_proto(DraftedTrees(
        tokens, parents, num_nodes, np.array(committed or [7] * len(trees)), errors or {}))


def place(drafter: RemoteDrafter, rows: list[Row], msg: drafter_pb2.DraftTrees | None
          ) -> torch.Tensor:
    staging = _Staging(len(rows), 1 + NODES, torch.device("cpu"))
    np.copyto(staging.planes, staging.default)
    staging.planes[TOKENS, :, 0] = 5
    drafter._place(list(enumerate(rows)), msg, staging.host, VOCAB)
    return staging.host


def test_bad_trees_are_refused_with_the_reason_and_only_their_rows_stop_drafting(
    drafter: RemoteDrafter,
) -> None:
    rows = [row(i) for i in range(8)]
    rows[3].num_nodes = 2  # this row asked for 2 nodes
    trees = [
        (GOOD_TOKENS, GOOD_PARENTS),
        (GOOD_TOKENS, GOOD_PARENTS),  # the drafter's own error
        (GOOD_TOKENS, GOOD_PARENTS),  # built on another committed length
        (GOOD_TOKENS, GOOD_PARENTS),  # 3 nodes for a row of 2
        ([5, 1, 2, 3], [-1, 0, 2, 1]),  # parents[2] = 2
        ([5, 1, 1], [-1, 0, 0]),  # twin siblings
        ([5, 1, 2, 3, 4], [-1, 0, 1, 2, 3]),  # depth 4 > L = 3
        ([6, 1], [-1, 0]),  # not rooted at the bonus token
    ]
    msg = reply(trees, committed=[7, 7, 6, 7, 7, 7, 7, 7],
                errors={1: ("unknown session 'r1'", "NOT_FOUND")})
    problems = drafter.tree_problems(rows, draft_codec.draft_trees_from_proto(msg, 8, 5),
                                     VOCAB, NODES)
    assert sorted(problems) == [1, 2, 3, 4, 5, 6, 7]
    assert problems[1] == "drafter error NOT_FOUND: unknown session 'r1'"
    assert problems[2] == "stale tree built on committed length 6, the row is at 7"
    assert "3 nodes besides the root exceed max_nodes 2" in problems[3]
    assert "parents[2] = 2 must be a node before 2" in problems[4]
    assert "nodes 1 and 2 are siblings with the same token 1" in problems[5]
    assert "node 4 has depth 4 > max_depth 3" in problems[6]
    assert "tree root 6 is not the bonus token 5" in problems[7]
    assert all(p.startswith(("drafter error", "stale", "invalid tree from the drafter: "))
               for p in problems.values())

    host = place(drafter, rows, msg)
    assert [r.drafting for r in rows] == [True] + [False] * 7
    assert [r.num_nodes for r in rows] == [NODES] + [0] * 7
    assert host[TOKENS, 0].tolist() == [5, 1, 2, 3, 0]
    assert host[PARENTS, 0].tolist() == [-1, 0, 0, 1, 0]
    assert host[DEPTH, 0].tolist() == [0, 1, 1, 2, 1]  # padding nodes at depth 1
    assert host[VALID, 0].tolist() == [1, 1, 1, 1, 0]
    for b in range(1, 8):  # the refused rows verify the root alone
        assert host[:, b, 0].tolist() == [5, -1, 0, 1] and not host[VALID, b, 1:].any()


def test_a_malformed_or_missing_reply_stops_every_row(drafter: RemoteDrafter) -> None:
    rows = [row(i) for i in range(3)]
    place(drafter, rows, reply([(GOOD_TOKENS, GOOD_PARENTS)] * 2))  # 2 trees for 3 rows
    assert not any(r.drafting for r in rows)
    rows = [row(i) for i in range(2)]
    host = place(drafter, rows, None)  # the round's exchange failed
    assert not any(r.drafting for r in rows) and not host[VALID, :, 1:].any()


def test_a_round_of_good_trees_lands_in_every_rows_place_with_its_depths(
    drafter: RemoteDrafter,
) -> None:
    rows = [row(i) for i in range(3)]
    chain, star = ([5, 1, 2, 3], [-1, 0, 1, 2]), ([5, 1, 2], [-1, 0, 0])
    staging = _Staging(4, 1 + NODES, torch.device("cpu"))
    np.copyto(staging.planes, staging.default)
    staging.planes[TOKENS, :, 0] = 5
    ordered = [(2, rows[0]), (0, rows[1]), (3, rows[2])]  # batch places out of order
    drafter._place(ordered, reply([chain, star, (GOOD_TOKENS, GOOD_PARENTS)]), staging.host,
                   VOCAB)
    host = staging.host
    assert all(r.drafting for r in rows)
    assert host[TOKENS, 2].tolist() == [5, 1, 2, 3, 0]
    assert host[DEPTH, 2].tolist() == [0, 1, 2, 3, 1]  # the chain; padding at depth 1
    assert host[PARENTS, 0].tolist() == [-1, 0, 0, 0, 0]
    assert host[VALID, 0].tolist() == [1, 1, 1, 0, 0]
    assert host[DEPTH, 3].tolist() == [0, 1, 1, 2, 1]
    assert host[:, 1, 0].tolist() == [5, -1, 0, 1] and not host[VALID, 1, 1:].any()  # no tree


def test_a_shape_the_drafter_has_not_answered_yet_gets_the_longest_deadline(
        drafter: RemoteDrafter) -> None:
    """The drafter's first round of a (rows, nodes) shape captures its graphs (~0.3 s on
    the H200): waiting only the adaptive few-round-trip deadline stopped every row of the
    first batch-8 round from drafting (lease 8 call 21). That round does not stretch the
    moving average either."""
    assert drafter.deadline_s((1, NODES)) == 1.0  # nothing timed yet: the longest
    drafter._observe(0.003, (1, NODES))
    assert drafter.deadline_s((1, NODES)) == MIN_DEADLINE_S
    assert drafter.deadline_s((8, NODES)) == 1.0  # a new shape
    drafter._observe(0.4, (8, NODES))  # its capture
    assert drafter.deadline_s((8, NODES)) == MIN_DEADLINE_S
    assert RemoteDrafter.shape_of([row(0), row(1, num_nodes=2)]) == (2, NODES)


def test_a_new_shape_may_wait_longer_than_any_round_its_first_compile(
        drafter: RemoteDrafter) -> None:
    """On a fresh host the drafter compiles kernels for a new (rows, nodes) shape (10-13 s
    per tree size on the H200, lease 9 call 27): past the 10 s round deadline every row of
    that round lost its drafter. A shape not yet answered waits `new_shape_timeout_s`."""
    patient = RemoteDrafter(drafter.client, drafter.info, 1.0, 30.0)
    assert patient.deadline_s((8, NODES)) == 30.0
    patient._observe(0.003, (8, NODES))
    assert patient.deadline_s((8, NODES)) == MIN_DEADLINE_S
    assert patient.deadline_s((4, NODES)) == 30.0
