"""The tree build of a round in one kernel: from each depth's top-K draft tokens to the
batch's trees (one program per row), the same trees as `ddtree.tree.build_round_tree`.

`build_round_tree` in PyTorch runs ~15 stable sorts (one per depth's beam, one over the
union, one that puts the chain first) and ~100 small gathers, scatters, concatenations
and copies per round: on the H200 that was ~0.25 ms of a ~2 ms tree round at batch 1, in
kernels of 1-5 us each. Here one program per row does the whole beam search in registers
and a few kilobytes of scratch (in L2): it loads every depth's top-K tokens and their
log-probabilities first (none depends on the beams); per depth it forms the candidate
extensions (parent beam position, token rank) that can enter the beam, their scores from
the previous beam's (`tl.gather`, in registers), ranks their unique keys (score
descending, then the candidate's index: what a stable sort does) and keeps the best
`width` (a bitonic top-W: the first W of a sort, with less work); then it takes the best N
of the union of all depths by (chain first where asked, score, union index) and remaps
parents to node indices. (Loading each depth's tokens, then
their log-probabilities, then the previous beam from scratch, one after another, cost
2.2 us more at 16 nodes and 28 us more at 63 on the H200: lease 34.)

Every score is the same float32 sum as in PyTorch (the depth's log-probability, logit -
log-sum-exp, added to the parent's score, in the same order) and every order is the same
total order, so the trees are bitwise those of `build_round_tree`
(tests/kernels/test_tree_build.py). The vocabulary part is the stable top-K and the
log-sum-exp over the vocabulary (`ddtree.kernels.vocab_topk`, or torch beyond its K).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree.kernels.launch import launch_kwargs, use_pdl, wait_for_inputs

# Union and candidate indices travel in the low 16 bits of a sort key.
_INDEX_BITS = 16


@triton.jit
def _order_key(score, index, flag):
    """A unique int64 whose descending order is (flag, score) descending, then index
    ascending: the order of a stable descending sort by score among equal flags. Scores
    are float32 (the sign-magnitude bits made monotone as a signed integer)."""
    bits = score.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64) + 2147483648
    return (flag.to(tl.int64) << 49) | (ordered << 16) | (65535 - index.to(tl.int64))


@triton.jit
def _index_of(key):
    return 65535 - (key & 65535)


@triton.jit
def _tree_build_kernel(
    logits_ptr, lse_ptr, rank_tokens_ptr, bonus_ptr, budget_ptr, force_ptr, max_topk_ptr,
    cand_parent_ptr, cand_rank_ptr, widths_ptr, starts_ptr, union_depth_ptr, union_chain_ptr,
    s_score_ptr, s_token_ptr, s_parent_ptr, s_node_ptr, s_key_ptr,
    tokens_ptr, parents_ptr, depth_ptr, valid_ptr, scores_ptr,
    stride_lb, stride_ll, stride_tb, stride_tl, num_union,
    NUM_LEVELS: tl.constexpr, L_PAD: tl.constexpr, NUM_RANKS: tl.constexpr,
    K_PAD: tl.constexpr, NUM_NODES: tl.constexpr, M_PAD: tl.constexpr,
    W_PAD: tl.constexpr, U_PAD: tl.constexpr, N_PAD: tl.constexpr, KEY_PAD: tl.constexpr,
    USE_PDL: tl.constexpr = False, TOPK: tl.constexpr = True,
):
    wait_for_inputs(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    budget = tl.load(budget_ptr + row)
    force = tl.load(force_ptr + row) != 0
    max_topk = tl.load(max_topk_ptr + row)
    logits_row = logits_ptr + row * stride_lb
    tokens_row = rank_tokens_ptr + row * stride_tb
    s_score = s_score_ptr + row * U_PAD
    s_token = s_token_ptr + row * U_PAD
    s_parent = s_parent_ptr + row * U_PAD
    s_node = s_node_ptr + row * U_PAD
    s_key = s_key_ptr + row * KEY_PAD
    m = tl.arange(0, M_PAD)
    j = tl.arange(0, W_PAD)
    neg_inf = float("-inf")

    # Every depth's top-K tokens and their log-probabilities, loaded at once ((depth, rank)
    # tables): none depends on the beams, so a depth's loop below waits only on its
    # candidate tables (a few hundred bytes, cached) instead of a chain of loads (one
    # load after another and scratch round trips took ~2.5 us a depth on the H200).
    levels = tl.arange(0, L_PAD)
    lv = levels[:, None]  # (L_PAD, 1)
    ranks = tl.arange(0, K_PAD)[None, :]  # (1, K_PAD)
    rank_ok = (lv < NUM_LEVELS) & (ranks < NUM_RANKS)
    all_token = tl.load(tokens_row + lv * stride_tl + ranks, mask=rank_ok, other=0)
    # Their log-probabilities: logit - the depth's log-sum-exp (`rank_log_probs`), 0.0
    # for -0.0.
    lse = tl.load(lse_ptr + row * NUM_LEVELS + lv, mask=lv < NUM_LEVELS, other=0.0)
    all_logp = tl.load(logits_row + lv * stride_ll + all_token, mask=rank_ok,
                       other=neg_inf) - lse
    all_logp = tl.where(all_logp == 0.0, 0.0, all_logp)
    all_logp = tl.where((max_topk > 0) & (ranks >= max_topk), neg_inf, all_logp)
    all_logp_bits = all_logp.to(tl.int32, bitcast=True)  # a row picked exactly by int sums
    widths = tl.load(widths_ptr + levels, mask=levels < NUM_LEVELS, other=0)
    starts = tl.load(starts_ptr + levels, mask=levels < NUM_LEVELS, other=0)

    # The beam of each depth: its candidates are (parent beam position, token rank) pairs
    # from the tables (depth 1: the root's, whose score is 0), sorted, the best `width` kept.
    beam = tl.zeros([W_PAD], dtype=tl.float32)  # the previous depth's beam scores
    prev_start = tl.sum(tl.where(levels == 0, starts, 0))
    for level in range(NUM_LEVELS):
        parent = tl.load(cand_parent_ptr + level * M_PAD + m)  # -1: padding
        rank = tl.load(cand_rank_ptr + level * M_PAD + m)
        real = parent >= 0
        this = lv == level
        token_row = tl.sum(tl.where(this, all_token, 0), axis=0)  # (K_PAD,)
        logp_row_bits = tl.sum(tl.where(this, all_logp_bits, 0), axis=0)
        token = tl.where(real, tl.gather(token_row, rank, 0), 0)
        logp = tl.where(real, tl.gather(logp_row_bits, rank, 0).to(tl.float32, bitcast=True),
                        neg_inf)
        prev = tl.where(real & (level > 0), tl.gather(beam, tl.maximum(parent, 0), 0), 0.0)
        cand = prev + logp
        keys = _order_key(cand, m, real.to(tl.int32))
        if TOPK:  # the best W_PAD keys, best first: the sort's first W_PAD, less work
            best = tl.topk(keys, W_PAD)
        else:
            best = tl.gather(tl.sort(keys, descending=True), j, 0)
        width = tl.sum(tl.where(levels == level, widths, 0))
        start = tl.sum(tl.where(levels == level, starts, 0))
        keep = j < width
        pick = tl.where(keep, _index_of(best), 0)
        beam = tl.where(keep, tl.gather(cand, pick, 0), neg_inf)
        tl.store(s_score + start + j, beam, mask=keep)
        tl.store(s_parent + start + j,
                 tl.where(level > 0, prev_start + tl.gather(parent, pick, 0), -1), mask=keep)
        tl.store(s_token + start + j, tl.gather(token, pick, 0), mask=keep)
        prev_start = start
    tl.debug_barrier()  # the beams' stores visible to every thread

    # The union of all depths: the chain first where asked, then by score and index.
    u = tl.arange(0, U_PAD)
    in_union = u < num_union
    score = tl.load(s_score + u, mask=in_union, other=neg_inf)
    chain = tl.load(union_chain_ptr + u, mask=in_union, other=0) != 0
    flag = tl.where(in_union, tl.where(force & chain, 2, 1), 0)
    union_keys = _order_key(score, u, flag)
    i = tl.arange(0, N_PAD)
    is_node = i < NUM_NODES
    tl.store(s_node + u, tl.zeros([U_PAD], dtype=tl.int32))
    if TOPK:  # the best N_PAD, best first
        pick = tl.where(is_node, _index_of(tl.topk(union_keys, N_PAD)), 0)
        tl.debug_barrier()
    else:
        tl.store(s_key + u, tl.sort(union_keys, descending=True))
        tl.debug_barrier()
        pick = tl.where(is_node, _index_of(tl.load(s_key + i, mask=is_node, other=0)), 0)
    tl.store(s_node + pick, (i + 1).to(tl.int32), mask=is_node)
    tl.debug_barrier()
    score = tl.load(s_score + pick, mask=is_node, other=neg_inf)
    token = tl.load(s_token + pick, mask=is_node, other=0)
    union_parent = tl.load(s_parent + pick, mask=is_node, other=-1)
    has_parent = is_node & (union_parent >= 0)
    parent = tl.load(s_node + tl.maximum(union_parent, 0), mask=has_parent, other=0)
    depth = tl.load(union_depth_ptr + pick, mask=is_node, other=1)
    valid = (i + 1 <= budget) & (score > neg_inf)
    out = row * (NUM_NODES + 1) + 1 + i
    tl.store(tokens_ptr + out, tl.where(valid, token, 0), mask=is_node)
    tl.store(parents_ptr + out, tl.where(valid, parent.to(tl.int64), 0), mask=is_node)
    tl.store(depth_ptr + out, tl.where(valid, depth, 1), mask=is_node)
    tl.store(valid_ptr + out, valid, mask=is_node)
    tl.store(scores_ptr + out, score, mask=is_node)
    root = row * (NUM_NODES + 1)
    tl.store(tokens_ptr + root, tl.load(bonus_ptr + row))
    tl.store(parents_ptr + root, -1)
    tl.store(depth_ptr + root, 0)
    tl.store(valid_ptr + root, tl.full([], True, tl.int1))
    tl.store(scores_ptr + root, 0.0)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@functools.lru_cache(maxsize=64)
def _pairs(num_ranks: int, widths: tuple[int, ...]) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Per depth, the (parent beam position, rank) extensions that can enter its beam,
    p-major: (p, r) trails (p+1)(r+1) - 1 at least as good ones, so only (p+1)(r+1) <= width
    can (the rule of ddtree.tree._candidate_pairs; depth 1 extends the root alone)."""
    return tuple(tuple((p, r) for p in range(1 if level == 0 else widths[level - 1])
                       for r in range(min(num_ranks, width // (p + 1))))
                 for level, width in enumerate(widths))


def supports(num_nodes: int, num_ranks: int, widths: tuple[int, ...]) -> bool:
    """Whether the kernel builds this shape (`widths`: ddtree.tree._beam_widths): the union
    holds at least N entries, and union and candidate indices fit a key's 16 bits."""
    most = max(len(level) for level in _pairs(num_ranks, widths))
    return num_nodes <= sum(widths) < (1 << _INDEX_BITS) and most < (1 << _INDEX_BITS)


@functools.lru_cache(maxsize=64)
def _tables(num_ranks: int, widths: tuple[int, ...], device: torch.device
            ) -> tuple[tuple[Tensor, ...], int, int, int]:
    """The shapes-only tables of a build: per depth its candidate pairs (-1 padded to
    M_PAD), widths and union starts; per union entry its depth and whether it is its
    depth's first (the chain's). Built eagerly (the graph runner warms every round up
    before it captures) and cached. Returns (tables, U, M_PAD, W_PAD)."""
    num_levels = len(widths)
    starts = [sum(widths[:level]) for level in range(num_levels)]
    pairs = _pairs(num_ranks, widths)
    m_pad = _pow2(max(len(level) for level in pairs))
    cand_parent = torch.full((num_levels, m_pad), -1, dtype=torch.int32)
    cand_rank = torch.zeros((num_levels, m_pad), dtype=torch.int32)
    for level, level_pairs in enumerate(pairs):
        if level_pairs:
            cand_parent[level, :len(level_pairs)] = torch.tensor([p for p, _ in level_pairs])
            cand_rank[level, :len(level_pairs)] = torch.tensor([r for _, r in level_pairs])
    num_union = sum(widths)
    union_depth = torch.ones(_pow2(num_union), dtype=torch.int64)
    union_chain = torch.zeros(_pow2(num_union), dtype=torch.int8)
    for level, (start, width) in enumerate(zip(starts, widths, strict=True)):
        union_depth[start:start + width] = level + 1
        union_chain[start] = 1
    tables = tuple(t.to(device) for t in (
        cand_parent, cand_rank, torch.tensor(widths, dtype=torch.int64),
        torch.tensor(starts, dtype=torch.int64), union_depth, union_chain))
    return tables, num_union, m_pad, _pow2(max(widths))


def tree_from_ranks(logits: Tensor, lse: Tensor, rank_tokens: Tensor, bonus: Tensor,
                    widths: tuple[int, ...], num_nodes: int, budget: Tensor,
                    force_chain: Tensor, max_topk: Tensor, num_warps: int | None = None,
                    select_topk: bool = True,
                    out: tuple[Tensor, Tensor, Tensor, Tensor] | None = None
                    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """logits: (B, L, V) float32 with contiguous rows; lse: (B, L) float32 their
    log-sum-exp; rank_tokens: (B, L, K) int64, each depth's top K tokens (most probable
    first, ties to the lower id); widths:
    the beam width of each depth (ddtree.tree._beam_widths(N, K, L)); bonus, budget,
    max_topk: (B,) int64; force_chain: (B,) bool (or integers, nonzero = True).
    -> tokens, parents, depth (B, 1+N) int64, valid (B, 1+N) bool, scores (B, 1+N) float32:
    `build_round_tree`'s tree (which see for the rules); `out`: the first four written
    there (contiguous, those shapes and dtypes: a round's buffers) instead of new tensors.
    num_warps: the program's (None: `warps_for(num_nodes)`). `select_topk`: each depth's
    beam from a bitonic top-W of its candidate keys (at 63 nodes the best 64 of 512: ~40%
    fewer compare-exchanges than sorting all 512) and the nodes from a top-N of the union
    (64 of 1,024) instead of full sorts; the same keys, the same trees."""
    batch, num_levels, _ = logits.shape
    num_ranks = rank_tokens.shape[2]
    assert logits.dtype == torch.float32 and logits.stride(2) == 1, (logits.dtype,
                                                                     logits.stride())
    assert lse.shape == (batch, num_levels) and lse.dtype == torch.float32, lse.shape
    assert rank_tokens.shape[:2] == (batch, num_levels) and rank_tokens.stride(2) == 1
    assert len(widths) == num_levels and supports(num_nodes, num_ranks, widths), widths
    device = logits.device
    tables, num_union, m_pad, w_pad = _tables(num_ranks, widths, device)
    assert w_pad <= m_pad, (w_pad, m_pad)  # a depth's width never exceeds its candidates
    u_pad, n_pad = _pow2(num_union), _pow2(num_nodes)
    assert n_pad <= u_pad, (n_pad, u_pad)  # `supports`: the union holds N nodes at least
    key_pad = 1 if select_topk else max(m_pad, u_pad)  # the sorts' scratch (A/B only)
    s_score = torch.empty(batch, u_pad, dtype=torch.float32, device=device)
    s_token = torch.empty(batch, u_pad, dtype=torch.int64, device=device)
    s_parent = torch.empty(batch, u_pad, dtype=torch.int64, device=device)
    s_node = torch.empty(batch, u_pad, dtype=torch.int32, device=device)
    s_key = torch.empty(batch, key_pad, dtype=torch.int64, device=device)
    shape = (batch, num_nodes + 1)
    if out is None:
        tokens, parents, depth = (torch.empty(shape, dtype=torch.int64, device=device)
                                  for _ in range(3))
        valid = torch.empty(shape, dtype=torch.bool, device=device)
    else:
        tokens, parents, depth, valid = out
        assert all(t.shape == shape and t.is_contiguous() for t in out), shape
        assert valid.dtype == torch.bool and tokens.dtype == parents.dtype == depth.dtype \
            == torch.int64
    scores = torch.empty(shape, dtype=torch.float32, device=device)
    pdl = use_pdl(logits)
    _tree_build_kernel[(batch,)](
        logits, lse.contiguous(), rank_tokens, bonus.long().contiguous(),
        budget.long().contiguous(), force_chain.contiguous(), max_topk.long().contiguous(),
        *tables,
        s_score, s_token, s_parent, s_node, s_key,
        tokens, parents, depth, valid, scores,
        logits.stride(0), logits.stride(1), rank_tokens.stride(0), rank_tokens.stride(1),
        num_union, NUM_LEVELS=num_levels, L_PAD=_pow2(num_levels), NUM_RANKS=num_ranks,
        K_PAD=_pow2(num_ranks), NUM_NODES=num_nodes,
        M_PAD=m_pad, W_PAD=w_pad, U_PAD=u_pad, N_PAD=n_pad, KEY_PAD=key_pad, USE_PDL=pdl,
        TOPK=select_topk,
        num_warps=num_warps or warps_for(num_nodes), **launch_kwargs(pdl))
    return tokens, parents, depth, valid, scores


def warps_for(num_nodes: int) -> int:
    """A row's program's warps by tree size (lease 39, call 137, H200, us a launch at
    2 / 4 / 8 / 16 warps: 16 nodes 18.7 / 18.0 / 20.8 / 27.2; 32 nodes 29.0 / 26.2 / 30.4 /
    38.2; 63 nodes 87.1 / 55.2 / 48.3 / 50.7; 127 nodes 203.7 / 139.1 / 108.1 / 101.1;
    batch 8 the same): the selections' bitonic networks outgrow 4 warps past 32 nodes.
    The warps only schedule the compare-exchanges of unique keys: the same trees."""
    return 4 if num_nodes <= 32 else 8 if num_nodes <= 64 else 16
