"""The verify half's bookkeeping kernels (ddtree/kernels/round_commit.py) give exactly what
the PyTorch round gives: the tree metadata and ancestor chains, the greedy walk's output
table, state and pending features, and the compacted KV pool - on random trees with
padding and invalid nodes, linear-rule rows, trees larger than the walk's comparison block,
and through `verify_into` with a real target forward (bitwise the same tables, state,
pending context and pool with the kernels on and off). `DEVICE` (DDTREE_TEST_DEVICE, the
CPU by default) runs them on a GPU: scripts/gpu/round_commit_check.py."""

from __future__ import annotations

import os

import pytest
import torch

from ddtree.acceptance import walk
from ddtree.engine.round import BucketKey, RoundBuffers, verify_into
from ddtree.engine.state import BONUS, COMMITTED, FIRST_CHILD, PENDING, SlotState
from ddtree.kernels import round_commit
from ddtree.models.kv_pool import KVPool
from ddtree.models.meta import tree_meta
from ddtree.models.ops import Backend
from ddtree.sampling import RowSampling
from ddtree.tree import DraftTree, ancestor_chains

COLUMNS = (COMMITTED, BONUS, FIRST_CHILD, PENDING)
DEVICE = torch.device(os.environ.get("DDTREE_TEST_DEVICE", "cpu"))


def random_trees(batch: int, num_nodes: int, width: int, vocab: int, seed: int,
                 padding: int = 0) -> DraftTree:
    """Topologically ordered trees no deeper than width - 1, ~15% of the nodes invalid, and
    the last `padding` nodes of every other row padding as the tree build writes it
    (invalid, a child of the root at depth 1, token 0)."""
    gen = torch.Generator().manual_seed(seed)
    size = num_nodes + 1
    parents = torch.full((batch, size), -1, dtype=torch.long)
    depth = torch.zeros(batch, size, dtype=torch.long)
    for b in range(batch):
        for i in range(1, size):
            open_nodes = [j for j in range(i) if depth[b, j] < width - 1]
            p = open_nodes[int(torch.randint(len(open_nodes), (1,), generator=gen))]
            parents[b, i], depth[b, i] = p, depth[b, p] + 1
    tokens = torch.randint(vocab, (batch, size), generator=gen)
    valid = torch.rand(batch, size, generator=gen) > 0.15
    valid[:, 0] = True
    for b in range(0, batch, 2):
        if padding:
            parents[b, -padding:], depth[b, -padding:] = 0, 1
            tokens[b, -padding:], valid[b, -padding:] = 0, False
    return DraftTree(*(t.to(DEVICE) for t in (tokens, parents, depth)), valid=valid.to(DEVICE))


def greedy_logits(tree: DraftTree, vocab: int, seed: int) -> torch.Tensor:
    """(B, 1+N, V) logits whose argmax at most nodes is the token of one of its children,
    the lowest-index one where several are picked (long accepted paths, under the linear
    rule too), random elsewhere."""
    gen = torch.Generator().manual_seed(seed)
    batch, size = tree.tokens.shape
    logits = torch.randn(batch, size, vocab, generator=gen)
    parents, tokens = tree.parents.cpu(), tree.tokens.cpu()
    for b in range(batch):
        for i in range(size - 1, 0, -1):
            if torch.rand(1, generator=gen) < 0.7:
                logits[b, parents[b, i], tokens[b, i]] = 10.0 + size - i
    return logits.to(DEVICE)


def state_for(batch: int, width: int, features: int, seed: int) -> tuple[SlotState, torch.Tensor]:
    """A state of 2B slots with random committed lengths, linear-rule flags and pending
    context; the batch's rows are every other slot, backwards."""
    gen = torch.Generator().manual_seed(seed)
    state = SlotState(2 * batch, width, features, DEVICE, torch.float32)
    state.ints[:, COMMITTED] = torch.randint(1, 20, (2 * batch + 1,), generator=gen).to(DEVICE)
    state.ints[:, FIRST_CHILD] = torch.randint(0, 2, (2 * batch + 1,), generator=gen).to(DEVICE)
    state.ints[:, BONUS] = 77
    if state.pending is not None:
        state.pending.copy_(torch.randn(state.pending.shape, generator=gen))
    rows = torch.arange(2 * batch - 1, -1, -2, device=DEVICE)
    return state, rows


@pytest.mark.parametrize(("num_nodes", "width", "padding"),
                         [(4, 16, 0), (16, 16, 3), (64, 16, 5), (40, 6, 0), (129, 8, 7)])
def test_tree_meta_is_ancestor_chains_and_tree_meta(num_nodes: int, width: int,
                                                     padding: int) -> None:
    batch = 5
    tree = random_trees(batch, num_nodes, width, 9, num_nodes, padding)
    state, rows = state_for(batch, width, 0, num_nodes)
    committed = state.ints[rows, COMMITTED]
    _, chains = ancestor_chains(tree.parents, width)
    want = tree_meta(rows, committed, tree.parents, tree.depth, width, 100, chains)
    positions, slots, write_pos, base, num_keys, got_chains = round_commit.tree_meta(
        rows, state.ints, COMMITTED, tree.parents, tree.depth, width)
    assert torch.equal(got_chains, chains)
    for name, have in (("positions", positions), ("write_slot", slots),
                       ("query_slot", slots), ("write_pos", write_pos),
                       ("prefix_len", base), ("tree_base", base),
                       ("num_tree_keys", num_keys)):
        assert torch.equal(have, getattr(want, name)), name
    assert torch.equal(got_chains.view(-1, width), want.tree_keys)


@pytest.mark.parametrize(("num_nodes", "width", "padding"),
                         [(4, 16, 0), (16, 16, 3), (40, 6, 2), (64, 16, 5), (129, 8, 7)])
def test_greedy_walk_commits_what_the_pytorch_round_commits(num_nodes: int, width: int,
                                                            padding: int) -> None:
    batch, vocab, num_features = 6, 7, 24
    tree = random_trees(batch, num_nodes, width, vocab, 100 + num_nodes, padding)
    assert tree.valid is not None
    logits = greedy_logits(tree, vocab, num_nodes)
    features = torch.randn(batch * (num_nodes + 1), num_features).to(DEVICE, torch.bfloat16)
    state, rows = state_for(batch, width, num_features, num_nodes)
    expected = SlotState.over(state.ints.clone(), state.pending.clone())
    _, chains = ancestor_chains(tree.parents, width)

    # the PyTorch round's walk and commit (verify_into's generic path)
    committed = expected.ints[rows, COMMITTED]
    zeros = torch.zeros(batch, dtype=torch.long, device=DEVICE)
    sampling = RowSampling(zeros.float(), zeros, zeros.float() + 1, zeros, False, False)
    walked = walk(tree, logits, sampling, committed, expected.ints[rows, FIRST_CHILD].bool(),
                  width - 1, chains)
    index = walked.path[:, :, None].expand(-1, -1, num_features)
    assert expected.pending is not None
    expected.pending[rows] = features.view(batch, num_nodes + 1, -1).gather(1, index).float()
    expected.ints[rows, PENDING] = walked.acceptance_length
    expected.ints[rows, COMMITTED] = committed + walked.acceptance_length
    expected.ints[rows, BONUS] = walked.next_token
    want_out = torch.cat([walked.acceptance_length[:, None], walked.next_token[:, None],
                          tree.tokens.gather(1, walked.path), walked.path], dim=1)
    assert int(walked.acceptance_length.max()) > 2, "the trees should accept long paths"

    out = torch.full((batch, 2 + 2 * width), -5, dtype=torch.long, device=DEVICE)
    chunks = round_commit.argmax_chunks(logits.view(-1, vocab))
    round_commit.greedy_walk(rows, state.ints, COLUMNS, tree.tokens, tree.parents, tree.valid,
                             tree.depth, chains, chunks, out, features, state.pending,
                             state.scratch)
    assert torch.equal(out, want_out)
    assert torch.equal(state.ints, expected.ints)
    assert torch.equal(state.pending, expected.pending)


def test_greedy_walk_without_pending_leaves_the_context_alone() -> None:
    batch, width = 3, 8
    tree = random_trees(batch, 10, width, 5, 7)
    assert tree.valid is not None
    state, rows = state_for(batch, width, 4, 7)
    assert state.pending is not None
    pending, pending_count = state.pending.clone(), state.ints[:, PENDING].clone()
    out = torch.zeros(batch, 2 + 2 * width, dtype=torch.long, device=DEVICE)
    _, chains = ancestor_chains(tree.parents, width)
    chunks = round_commit.argmax_chunks(greedy_logits(tree, 5, 7).view(-1, 5))
    round_commit.greedy_walk(rows, state.ints, COLUMNS, tree.tokens, tree.parents, tree.valid,
                             tree.depth, chains, chunks, out, None, None, state.scratch)
    assert torch.equal(state.pending, pending)
    assert torch.equal(state.ints[:, PENDING], pending_count)
    assert torch.equal(state.ints[rows, COMMITTED] - out[:, 0], state_for(batch, width, 4, 7)[0]
                       .ints[rows, COMMITTED])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compact_moves_what_the_pool_moves(dtype: torch.dtype) -> None:
    """Paths with entries past their acceptance length (0: the committed slot again) and
    sources overlapping other entries' destinations."""
    gen = torch.Generator().manual_seed(3)
    batch, width, num_rows = 4, 6, 20
    pool = KVPool(3, 5, 40, 2, 64, DEVICE, dtype)
    pool.k.copy_(torch.randn(pool.k.shape, generator=gen))
    pool.v.copy_(torch.randn(pool.v.shape, generator=gen))
    want = KVPool(3, 5, 40, 2, 64, DEVICE, dtype)
    want.k.copy_(pool.k)
    want.v.copy_(pool.v)
    rows = torch.tensor([3, 0, 4, 1], device=DEVICE)
    start = torch.tensor([5, 0, 11, 17], device=DEVICE)
    path = torch.zeros(batch, width, dtype=torch.long, device=DEVICE)
    path[0, :4] = torch.tensor([0, 2, 3, 7])
    path[1, :6] = torch.tensor([0, 1, 5, 6, 9, 19])
    path[2, :2] = torch.tensor([0, 4])
    path[3, :3] = torch.tensor([0, 1, 2])
    out = torch.zeros(batch, 2 + 2 * width, dtype=torch.long, device=DEVICE)
    out[:, 2 + width:] = path
    base = start[:, None].expand(batch, num_rows).reshape(-1).contiguous()
    want.compact(rows, start, path)
    round_commit.compact(pool.k, pool.v, rows, base, out, width, scratch=7)
    assert torch.equal(pool.k, want.k) and torch.equal(pool.v, want.v)


@pytest.mark.parametrize("vocab", [1, 5, 96, 2049, 49152])
def test_argmax_chunks_pick_what_argmax_picks(vocab: int) -> None:
    """Ties (integer logits), a row of -inf, NaNs (the largest, the first one wins), and
    vocabularies that leave the last chunk partly empty."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randint(-3, 3, (7, vocab), generator=gen).float()
    logits[1] = float("-inf")
    logits[2, vocab // 2] = float("nan")
    logits[3, vocab - 1] = float("nan")
    logits[3, vocab // 3] = float("nan")
    logits[4] = torch.randn(vocab, generator=gen)
    logits = logits.to(DEVICE)
    values, index = round_commit.argmax_chunks(logits)
    state = SlotState(7, 1, 0, DEVICE, torch.float32)
    out = torch.zeros(7, 4, dtype=torch.long, device=DEVICE)
    rows = torch.arange(7, device=DEVICE)
    round_commit.ar_commit(rows, state.ints, (COMMITTED, BONUS), (values, index), out,
                           state.scratch)
    assert torch.equal(out[:, 1], logits.argmax(dim=-1))


def test_verify_into_is_the_same_with_and_without_the_kernels() -> None:
    """A real target forward over random trees (padding rows on the scratch slot, linear
    rows, padding nodes), and an ar round: the output table, the real rows' logits,
    state, pending features and pool (but the scratch slot's) are bitwise the same
    through the kernels and through the PyTorch bookkeeping. (The two padding rows write
    their nodes' K/V at the same scratch slots in one launch and attend to them: their
    logits are garbage that may differ from run to run on the GPU, lease 37.)"""
    from tests.kernels.test_engine_on_kernels import make_pair

    with DEVICE:  # the fused weights are built where the model is
        target = make_pair("llama")[0]
    width, num_nodes, batch, layers = 4, 6, 3, (0, 1)
    tree = random_trees(batch, num_nodes, width, 96, 5, padding=2)
    assert tree.valid is not None
    for drafted in (True, False):
        results = []
        for fused in (False, True):
            target.backend = Backend(kernels=True, round_commit=fused)
            gen = torch.Generator().manual_seed(11)
            state = SlotState(3, width, len(layers) * 128, DEVICE, torch.float32)
            state.ints[:3, COMMITTED] = torch.tensor([9, 3, 14], device=DEVICE)
            state.ints[:3, FIRST_CHILD] = torch.tensor([0, 1, 0], device=DEVICE)
            state.ints[:3, BONUS] = torch.tensor([5, 50, 95], device=DEVICE)
            assert state.pending is not None
            state.pending.copy_(torch.randn(state.pending.shape, generator=gen))
            pool = target.new_pool(4, 32)
            pool.k.copy_(torch.randn(pool.k.shape, generator=gen))
            pool.v.copy_(torch.randn(pool.v.shape, generator=gen))
            nodes = num_nodes if drafted else 0
            buffers = RoundBuffers(batch + 2, nodes, width if drafted else 1, DEVICE)
            buffers.rows.copy_(torch.tensor([2, 0, 1, state.scratch, state.scratch]))
            if drafted:
                buffers.set_tree(DraftTree(
                    *(torch.cat([t, t[:2]]) for t in (tree.tokens, tree.parents, tree.depth)),
                    valid=torch.cat([tree.valid, tree.valid[:2]])))
            out = verify_into(state, target, pool, buffers, BucketKey(batch + 2, nodes),
                              layers if drafted else ())
            results.append((buffers.out.clone(), out.logits[:batch], state.ints,
                            state.pending[:3], pool.k[:, :3], pool.v[:, :3]))
        for name, plain, fused_value in zip(("out", "logits", "ints", "pending", "k", "v"),
                                            *results, strict=True):
            assert torch.equal(plain, fused_value), (drafted, name)
