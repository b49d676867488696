"""The drafter service's batched rounds (GraphDrafter): its start-up warm-up runs every
tree size on the scratch row only, so a real session's trees are what they would have
been without it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ddtree.engine.draft_graphs import (
    BONUS,
    BUDGET,
    COMMITTED,
    SLOTS,
    DraftInputs,
    GraphDrafter,
    ProposedTrees,
)
from ddtree.engine.drafting import ContextGraphs, LocalDrafter
from ddtree.models.tiny import make_tiny_pair
from ddtree.runtime import load_pair

NUM_SLOTS, MAX_BUDGET, PROMPT = 2, 32, 6


def session_trees(root: Path, warm_up: bool) -> tuple[set[tuple[int, int]], ProposedTrees]:
    """-> the (batch, nodes) shapes the warm-up ran, and a real session's trees after it."""
    target, drafter = load_pair(root / "target", root / "drafter", torch.device("cpu"),
                                torch.float32)
    assert drafter is not None
    local = LocalDrafter(drafter, target.embeddings, NUM_SLOTS, 64)
    width = len(local.target_layer_ids) * target.config.hidden_size
    graphs = GraphDrafter(local, NUM_SLOTS, MAX_BUDGET, width, use_graphs=False)
    if warm_up:
        graphs.warm_up()
    shapes = set(graphs._static)  # each shape's static buffers: made when it first ran
    local.start(0, "s0", torch.randn(PROMPT, width, generator=torch.Generator().manual_seed(3)))
    ints = np.zeros((7, 1), dtype=np.int64)
    ints[SLOTS], ints[COMMITTED], ints[BONUS], ints[BUDGET] = 0, PROMPT, 11, 16
    assert shapes == ({(b, n) for b in graphs.batches for n in graphs.node_buckets}
                      if warm_up else set())
    return shapes, graphs.propose(DraftInputs(ints, torch.zeros(0, width)))


def test_warm_up_runs_every_batch_and_tree_size_and_leaves_real_sessions_alone(
        tmp_path: Path) -> None:
    make_tiny_pair(tmp_path, family="llama")
    shapes, warmed = session_trees(tmp_path, warm_up=True)
    _, cold = session_trees(tmp_path, warm_up=False)
    assert (1, MAX_BUDGET) in shapes and (NUM_SLOTS, MAX_BUDGET) in shapes and len(shapes) >= 6
    assert np.array_equal(warmed.tokens, cold.tokens)
    assert np.array_equal(warmed.parents, cold.parents)
    assert warmed.num_nodes.tolist() == cold.num_nodes.tolist() == [17]


def test_first_context_in_static_buckets_is_the_eager_one_and_pads_into_scratch(
        tmp_path: Path) -> None:
    """ContextGraphs' padded store (the drafter service's graph work, run eagerly on the
    CPU): a prompt's K/V in the drafter pool are those of the eager `append_context`; the
    bucket's rows past the prompt land in the scratch row, not in the row's later
    positions; off by default (the verifier's own drafter stores eagerly)."""
    make_tiny_pair(tmp_path, family="llama")
    target, drafter = load_pair(tmp_path / "target", tmp_path / "drafter",
                                torch.device("cpu"), torch.float32)
    assert drafter is not None
    width = len(drafter.config.target_layer_ids) * target.config.hidden_size
    features = torch.randn(21, width, generator=torch.Generator().manual_seed(5))
    pools = []
    for static in (False, True):
        local = LocalDrafter(drafter, target.embeddings, NUM_SLOTS, 64)
        assert local.context.buckets == ()
        local.context = ContextGraphs(local, enabled=False, static=static)
        assert local.context.buckets == ((16, 32, 64) if static else ())
        local.pool.k.fill_(7.0)
        local.pool.v.fill_(7.0)
        local.start(1, "s1", features)  # 21 rows: the 32-token bucket when static
        pools.append((local.pool.k.clone(), local.pool.v.clone()))
    (k_eager, v_eager), (k_static, v_static) = pools
    torch.testing.assert_close(k_static[:, 1, :21], k_eager[:, 1, :21])
    torch.testing.assert_close(v_static[:, 1, :21], v_eager[:, 1, :21])
    assert (k_static[:, 1, 21:] == 7.0).all() and (k_static[:, 0] == 7.0).all()
    assert not (k_static[:, NUM_SLOTS, 21:32] == 7.0).all()  # the padding rows' K: scratch
