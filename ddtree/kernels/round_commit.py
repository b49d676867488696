"""The verify half's bookkeeping around the target forward in kernels, for rounds
whose rows all walk greedily (ddtree/engine/round.py `verify_into`):

- `tree_meta`: each row's ancestor chains and its queries' attention description (the
  fields of `ddtree.models.meta.tree_meta`, with the committed lengths read from the state
  table), one program per row;
- `greedy_walk`: the greedy walk of `ddtree.acceptance.walk` and the commit (the round's
  output table, the state's committed length, bonus token and pending count, and the
  path's target features as the row's pending drafter context), one program per row;
- `compact`: the KV compaction of `KVPool.compact`, one program per (row, layer);
- `argmax_chunks`: the target's greedy pick at every node, split over the vocabulary
  (`ARGMAX_CHUNKS` programs a logits row, torch.argmax's index: the first NaN, else the
  first largest), whose last reduce is done where the pick is read (the walk, `ar_commit`);
- `ar_commit`: the commit of a greedy ar round (the root alone: `tree_meta` over the
  buffers' root column gives its attention description).

Padding rows (a batch bucket's rows past the real ones) all name the scratch slot: no
kernel writes its state or moves its K/V, so several of them never race.

In PyTorch these are ~100 launches a tree round (pointer doubling, gathers, scatters,
comparisons and copies of a few hundred bytes each: lease 35's trace of a tree@16 round
at batch 1 held ~140 such kernels besides the model's). Everything here is integer
arithmetic and copies, so the results are exactly PyTorch's: the same integers, the same
pool bits (padding nodes, path entries past the acceptance length and the scratch row
included: tests/kernels/test_round_commit.py compares whole tables and pools).

The ancestor chains and depths use PyTorch's own algorithm (pointer doubling, in
registers through `tl.gather`). "Lowest-index (accepted) child of a parent" is asked the
other way round: a node is its parent's lowest-index such child iff no earlier node with
the same parent is one (compared in blocks of earlier nodes, so a program's registers
stay bounded at large trees).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree.kernels.launch import launch_kwargs, use_pdl, wait_for_inputs

J_BLOCK = 32  # earlier nodes compared at a time (the walk's sibling tests)
F_BLOCK = 512  # feature columns copied at a time
C_BLOCK = 1024  # K/V columns of a position copied at a time (the compaction)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@triton.jit
def _tree_meta_kernel(
    rows_ptr, ints_ptr, parents_ptr, depth_ptr,
    positions_ptr, slots_ptr, write_pos_ptr, base_ptr, chains_ptr, num_keys_ptr,
    stride_ints, COMMITTED: tl.constexpr, NUM_ROWS: tl.constexpr, WIDTH: tl.constexpr,
    M_PAD: tl.constexpr, W_PAD: tl.constexpr, DOUBLINGS: tl.constexpr,
    CHAIN_BITS: tl.constexpr, USE_PDL: tl.constexpr = False,
):
    wait_for_inputs(USE_PDL)
    b = tl.program_id(0).to(tl.int64)
    slot = tl.load(rows_ptr + b)
    committed = tl.load(ints_ptr + slot * stride_ints + COMMITTED)
    i = tl.arange(0, M_PAD)
    in_tree = i < NUM_ROWS
    first = b * NUM_ROWS
    parent = tl.load(parents_ptr + first + i, mask=in_tree, other=-1).to(tl.int64)
    depth = tl.load(depth_ptr + first + i, mask=in_tree, other=0).to(tl.int64)

    # ddtree.tree.ancestor_chains: depths from the parents by pointer doubling, then each
    # node's ancestor at every level composed of 2^k-th ancestors.
    derived = (parent >= 0).to(tl.int64)
    hop = tl.maximum(parent, 0)
    for _ in tl.static_range(DOUBLINGS):
        further = tl.gather(derived, hop, 0)
        hop = tl.gather(hop, hop, 0)
        derived = derived + further
    levels = tl.arange(0, W_PAD)
    hops = tl.maximum(derived[:, None] - levels[None, :], 0)  # (M_PAD, W_PAD)
    node = tl.broadcast_to(i.to(tl.int64)[:, None], (M_PAD, W_PAD))
    jump = tl.maximum(parent, 0)
    for k in tl.static_range(CHAIN_BITS):
        hopped = tl.gather(tl.broadcast_to(jump[:, None], (M_PAD, W_PAD)), node, 0)
        node = tl.where(((hops >> k) & 1) == 1, hopped, node)
        jump = tl.gather(jump, jump, 0)
    chains = tl.where(levels[None, :] <= derived[:, None], node, 0)

    # ddtree.models.meta.tree_meta: node j of the row writes at committed + j, sits at
    # position committed + depth and sees the committed prefix then its ancestor chain.
    out = first + i
    tl.store(positions_ptr + out, committed + depth, mask=in_tree)
    tl.store(slots_ptr + out, tl.zeros_like(depth) + slot, mask=in_tree)
    tl.store(write_pos_ptr + out, committed + i, mask=in_tree)
    tl.store(base_ptr + out, tl.zeros_like(depth) + committed, mask=in_tree)
    tl.store(num_keys_ptr + out, depth + 1, mask=in_tree)
    tl.store(chains_ptr + out[:, None] * WIDTH + levels[None, :], chains,
             mask=in_tree[:, None] & (levels[None, :] < WIDTH))


def tree_meta(rows: Tensor, ints: Tensor, committed_column: int, parents: Tensor,
              depth: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """rows: (B,) int64 pool slots; ints: the state's int64 table (its `committed_column`
    read at each row's slot); parents, depth: (B, M) int64, topologically ordered.
    -> positions, slots, write positions, committed lengths, numbers of tree keys (B*M,)
    and the ancestor chains (B, M, width), all int64: `tree_meta`'s fields over
    `ancestor_chains(parents, width)`."""
    batch, num_rows = parents.shape
    assert ints.dtype == torch.int64 and ints.stride(1) == 1, (ints.dtype, ints.stride())
    parents, depth = parents.contiguous(), depth.contiguous()
    positions, slots, write_pos, base, num_keys = (
        torch.empty(batch * num_rows, dtype=torch.int64, device=parents.device)
        for _ in range(5))
    chains = torch.empty(batch, num_rows, width, dtype=torch.int64, device=parents.device)
    pdl = use_pdl(parents)
    _tree_meta_kernel[(batch,)](
        rows.contiguous(), ints, parents, depth, positions, slots, write_pos, base, chains,
        num_keys, ints.stride(0),
        COMMITTED=committed_column, NUM_ROWS=num_rows, WIDTH=width, M_PAD=_pow2(num_rows),
        W_PAD=_pow2(width), DOUBLINGS=(num_rows - 1).bit_length(),
        CHAIN_BITS=max(1, (width - 1).bit_length()), USE_PDL=pdl, **launch_kwargs(pdl))
    return positions, slots, write_pos, base, num_keys, chains


ARGMAX_CHUNKS = 24  # programs a logits row is split over (the last reduce is the walk's)
_NO_INDEX = tl.constexpr(1 << 62)  # past every vocabulary index


@triton.jit
def _first_max(values, index, axis: tl.constexpr):
    """torch.argmax's pick along `axis`: the first NaN if any (NaN is the largest), else
    the first index of the largest value. -> (the picked value, its index)."""
    nan = values != values
    nan_index = tl.min(tl.where(nan, index, _NO_INDEX), axis=axis)
    largest = tl.max(tl.where(nan, float("-inf"), values), axis=axis)
    if axis == 0:
        hit = values == largest
    else:
        hit = values == tl.expand_dims(largest, axis)
    max_index = tl.min(tl.where(hit, index, _NO_INDEX), axis=axis)
    any_nan = nan_index < _NO_INDEX
    return tl.where(any_nan, float("nan"), largest), tl.where(any_nan, nan_index, max_index)


@triton.jit
def _argmax_chunk_kernel(logits_ptr, values_ptr, index_ptr, vocab, stride_row,
                         CHUNKS: tl.constexpr, BLOCK: tl.constexpr,
                         USE_PDL: tl.constexpr = False):
    """Program (r, c): chunk c of logits row r -> its first-max value and index."""
    wait_for_inputs(USE_PDL)
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    column = c * BLOCK + tl.arange(0, BLOCK)
    values = tl.load(logits_ptr + r * stride_row + column, mask=column < vocab,
                     other=float("-inf"))
    value, index = _first_max(values, column.to(tl.int64), 0)
    tl.store(values_ptr + r * CHUNKS + c, value)
    tl.store(index_ptr + r * CHUNKS + c, index)


@triton.jit
def _argmax_of_chunks(values_ptr, index_ptr, rows, row_mask, CHUNKS: tl.constexpr,
                      C_PAD: tl.constexpr):
    """The argmax of each logits row in `rows` ((R,) row numbers) from its chunks' picks
    (chunks in order: the first index among equal picks is the row's first)."""
    c = tl.arange(0, C_PAD)
    at = rows.to(tl.int64)[:, None] * CHUNKS + c[None, :]
    mask = row_mask[:, None] & (c[None, :] < CHUNKS)
    values = tl.load(values_ptr + at, mask=mask, other=float("-inf"))
    index = tl.load(index_ptr + at, mask=mask, other=_NO_INDEX)
    return _first_max(values, index, 1)[1]


def argmax_chunks(logits: Tensor) -> tuple[Tensor, Tensor]:
    """logits (R, V) float32 with contiguous rows -> each row's per-chunk first-max values
    (R, C) float32 and indices (R, C) int64 (`ARGMAX_CHUNKS` chunks; the walk or the ar
    commit takes the row's argmax from them: torch.argmax's index, ties to the first)."""
    assert logits.dim() == 2 and logits.stride(1) == 1, (logits.shape, logits.stride())
    num_rows, vocab = logits.shape
    block = max(16, _pow2(triton.cdiv(vocab, ARGMAX_CHUNKS)))
    chunks = triton.cdiv(vocab, block)
    values = torch.empty(num_rows, chunks, dtype=torch.float32, device=logits.device)
    index = torch.empty(num_rows, chunks, dtype=torch.int64, device=logits.device)
    pdl = use_pdl(logits)
    _argmax_chunk_kernel[(num_rows, chunks)](
        logits, values, index, vocab, logits.stride(0), CHUNKS=chunks, BLOCK=block,
        USE_PDL=pdl, num_warps=4 if block <= 2048 else 8, **launch_kwargs(pdl))
    return values, index


@triton.jit
def _ar_commit_kernel(rows_ptr, ints_ptr, values_ptr, index_ptr, out_ptr, stride_ints,
                      scratch, COMMITTED: tl.constexpr, BONUS: tl.constexpr,
                      CHUNKS: tl.constexpr, C_PAD: tl.constexpr,
                      USE_PDL: tl.constexpr = False):
    wait_for_inputs(USE_PDL)
    b = tl.program_id(0).to(tl.int64)
    slot = tl.load(rows_ptr + b)
    state = ints_ptr + slot * stride_ints
    committed = tl.load(state + COMMITTED)
    bonus = tl.load(state + BONUS)
    one = tl.full([1], 0, tl.int64) + b
    token = tl.sum(_argmax_of_chunks(values_ptr, index_ptr, one, one >= 0, CHUNKS, C_PAD))
    tl.store(out_ptr + b * 4, 1)
    tl.store(out_ptr + b * 4 + 1, token)
    tl.store(out_ptr + b * 4 + 2, bonus)
    tl.store(out_ptr + b * 4 + 3, 0)
    if slot != scratch:  # padding rows share the scratch slot: none writes it
        tl.store(state + COMMITTED, committed + 1)
        tl.store(state + BONUS, token)


def ar_commit(rows: Tensor, ints: Tensor, columns: tuple[int, int], chunks: tuple[Tensor, Tensor],
              out: Tensor, scratch: int) -> None:
    """The commit of a greedy ar round (`_verify_greedy_ar`'s): each row's next token is
    the argmax of its logits (`argmax_chunks`'s picks); its committed length grows by one,
    the token becomes its bonus; out (B, 4) = [1, token, the old bonus, 0]. The scratch
    slot's state is left alone (the padding rows')."""
    values, index = chunks
    assert out.shape == (rows.shape[0], 4) and out.is_contiguous(), out.shape
    pdl = use_pdl(out)
    _ar_commit_kernel[(rows.shape[0],)](
        rows.contiguous(), ints, values, index, out, ints.stride(0), scratch,
        COMMITTED=columns[0], BONUS=columns[1], CHUNKS=values.shape[1],
        C_PAD=_pow2(values.shape[1]), USE_PDL=pdl, **launch_kwargs(pdl))


@triton.jit
def _earlier_sibling(parents_ptr, flags_ptr, first, parent, i, NUM_ROWS: tl.constexpr,
                     M_PAD: tl.constexpr, J_BLOCK: tl.constexpr, FLAGS_FROM_VALID: tl.constexpr):
    """(M_PAD,) int32: 1 where an earlier node j < i with node i's parent has its flag set
    (FLAGS_FROM_VALID: the flag is being a child, i.e. a parent >= 0 and valid; else the
    int8 flags at flags_ptr)."""
    found = tl.zeros([M_PAD], dtype=tl.int32)
    for start in tl.static_range(0, M_PAD, J_BLOCK):
        j = start + tl.arange(0, J_BLOCK)
        in_tree = j < NUM_ROWS
        parent_j = tl.load(parents_ptr + first + j, mask=in_tree, other=-1)
        flag = tl.load(flags_ptr + first + j, mask=in_tree, other=0) != 0
        if FLAGS_FROM_VALID:
            flag = flag & (parent_j >= 0)
        same = ((j[None, :] < i[:, None]) & flag[None, :]
                & (parent_j[None, :] == parent[:, None]))
        found = found | tl.max(same.to(tl.int32), axis=1)
    return found


@triton.jit
def _greedy_walk_kernel(
    rows_ptr, ints_ptr, tokens_ptr, parents_ptr, valid_ptr, depth_ptr, chains_ptr,
    values_ptr, index_ptr, features_ptr, pending_ptr, out_ptr, accepted_ptr,
    stride_ints, stride_features, stride_pending_slot, stride_pending_row, num_features,
    scratch, COMMITTED: tl.constexpr, BONUS: tl.constexpr, FIRST_CHILD: tl.constexpr,
    PENDING: tl.constexpr, NUM_ROWS: tl.constexpr, WIDTH: tl.constexpr,
    M_PAD: tl.constexpr, W_PAD: tl.constexpr, J_BLOCK: tl.constexpr, F_BLOCK: tl.constexpr,
    CHUNKS: tl.constexpr, C_PAD: tl.constexpr,
    WRITE_PENDING: tl.constexpr, USE_PDL: tl.constexpr = False,
):
    wait_for_inputs(USE_PDL)
    b = tl.program_id(0).to(tl.int64)
    slot = tl.load(rows_ptr + b)
    committed = tl.load(ints_ptr + slot * stride_ints + COMMITTED)
    first_only = tl.load(ints_ptr + slot * stride_ints + FIRST_CHILD) != 0
    i = tl.arange(0, M_PAD)
    in_tree = i < NUM_ROWS
    first = b * NUM_ROWS
    parent = tl.load(parents_ptr + first + i, mask=in_tree, other=-1)
    token = tl.load(tokens_ptr + first + i, mask=in_tree, other=0)
    depth = tl.load(depth_ptr + first + i, mask=in_tree, other=0)
    choice = _argmax_of_chunks(values_ptr, index_ptr, first + i, in_tree, CHUNKS, C_PAD)
    valid = tl.load(valid_ptr + first + i, mask=in_tree, other=0) != 0

    # acceptance._considered_children, then the greedy test against the parent's argmax
    is_child = (parent >= 0) & valid
    not_first = _earlier_sibling(parents_ptr, valid_ptr, first, parent, i, NUM_ROWS, M_PAD,
                                 J_BLOCK, True)
    considered = is_child & ((not_first == 0) | (first_only == 0))
    accepted = considered & (token == tl.gather(choice, tl.maximum(parent, 0), 0))

    # acceptance._follow: the chosen child of a parent is its lowest-index accepted one; a
    # node is on the path iff every ancestor below the root (and itself) is chosen.
    tl.store(accepted_ptr + first + i, accepted.to(tl.int8), mask=in_tree)
    tl.debug_barrier()  # every thread's flags visible to every thread
    beaten = _earlier_sibling(parents_ptr, accepted_ptr, first, parent, i, NUM_ROWS, M_PAD,
                              J_BLOCK, False)
    chosen = (accepted & (beaten == 0)).to(tl.int32)
    levels = tl.arange(0, W_PAD)
    in_width = levels < WIDTH
    chains = tl.load(chains_ptr + (first + i)[:, None] * WIDTH + levels[None, :],
                     mask=in_tree[:, None] & in_width[None, :], other=0)
    chosen_chain = tl.gather(tl.broadcast_to(chosen[:, None], (M_PAD, W_PAD)), chains, 0)
    below = (levels[None, :] >= 1) & (levels[None, :] <= depth[:, None]) & in_width[None, :]
    all_chosen = tl.min(tl.where(below, chosen_chain, 1), axis=1) == 1
    on_path = (all_chosen & (depth <= WIDTH - 1) & in_tree) | (i == 0)
    hit = on_path[:, None] & (depth[:, None] == levels[None, :])  # (M_PAD, W_PAD)
    path = tl.sum(tl.where(hit, i[:, None].to(tl.int64), 0), axis=0)  # (W_PAD,) 0 past it
    length = tl.sum(on_path.to(tl.int64))
    last = tl.sum(tl.where(levels == length - 1, path, 0))
    bonus = tl.sum(tl.where(i == last, choice, 0))
    at = i[:, None] == path[None, :]  # (M_PAD, W_PAD): node i is path entry l
    path_tokens = tl.sum(tl.where(at, token[:, None], 0), axis=0)

    # the commit: the output table [length, bonus, path tokens, path], the state
    row_out = out_ptr + b * (2 + 2 * WIDTH)
    tl.store(row_out, length)
    tl.store(row_out + 1, bonus)
    tl.store(row_out + 2 + levels, path_tokens, mask=in_width)
    tl.store(row_out + 2 + WIDTH + levels, path, mask=in_width)
    if slot == scratch:  # padding rows share the scratch slot: none writes its state
        return
    state = ints_ptr + slot * stride_ints
    tl.store(state + COMMITTED, committed + length)
    tl.store(state + BONUS, bonus)
    if WRITE_PENDING:  # the path's features: the row's next pending drafter context
        tl.store(state + PENDING, length)
        source = features_ptr + (first + path)[:, None] * stride_features
        target = (pending_ptr + slot * stride_pending_slot
                  + levels[:, None].to(tl.int64) * stride_pending_row)
        for start in range(0, num_features, F_BLOCK):
            f = start + tl.arange(0, F_BLOCK)
            mask = in_width[:, None] & (f[None, :] < num_features)
            values = tl.load(source + f[None, :], mask=mask)
            tl.store(target + f[None, :], values.to(pending_ptr.dtype.element_ty), mask=mask)


def greedy_walk(rows: Tensor, ints: Tensor, columns: tuple[int, int, int, int],
                tokens: Tensor, parents: Tensor, valid: Tensor, depth: Tensor, chains: Tensor,
                chunks: tuple[Tensor, Tensor], out: Tensor, features: Tensor | None,
                pending: Tensor | None, scratch: int) -> None:
    """The greedy walk and commit of every row (`verify_into`'s, for rows that all walk
    greedily): rows (B,); ints: the state table, `columns` its (committed, bonus,
    first_child, pending) columns; tokens, parents, depth (B, M) int64, valid (B, M) bool;
    chains (B, M, W) from `tree_meta`; chunks: `argmax_chunks` of the (B*M, V) logits (the
    target's argmax at each node); out: the round's (B, 2 + 2W) int64 table. features
    (B*M, F) and pending (slots, W, F): the path's features become the row's pending
    context (and its pending count the acceptance length), or both None. The `scratch`
    slot's state is left alone (the padding rows')."""
    batch, num_rows = tokens.shape
    width = chains.shape[2]
    assert out.shape == (batch, 2 + 2 * width) and out.is_contiguous(), out.shape
    committed, bonus, first_child, pending_column = columns
    write_pending = features is not None and pending is not None
    if write_pending:
        assert features is not None and pending is not None
        assert features.stride(1) == 1 and pending.stride(2) == 1 and pending.shape[1] == width
        num_features = features.shape[1]
        stride_features, stride_slot, stride_row = (features.stride(0), pending.stride(0),
                                                    pending.stride(1))
    else:
        features = pending = out  # never read
        num_features = stride_features = stride_slot = stride_row = 0
    flags = torch.empty(batch, num_rows, dtype=torch.int8, device=tokens.device)
    values, index = chunks
    pdl = use_pdl(tokens)
    _greedy_walk_kernel[(batch,)](
        rows.contiguous(), ints, tokens.contiguous(), parents.contiguous(),
        valid.contiguous().view(torch.int8), depth.contiguous(), chains.contiguous(),
        values, index, features, pending, out, flags,
        ints.stride(0), stride_features, stride_slot, stride_row, num_features, scratch,
        COMMITTED=committed, BONUS=bonus, FIRST_CHILD=first_child, PENDING=pending_column,
        NUM_ROWS=num_rows, WIDTH=width, M_PAD=_pow2(num_rows), W_PAD=_pow2(width),
        J_BLOCK=min(J_BLOCK, _pow2(num_rows)), F_BLOCK=F_BLOCK, CHUNKS=values.shape[1],
        C_PAD=_pow2(values.shape[1]), WRITE_PENDING=write_pending,
        USE_PDL=pdl, **launch_kwargs(pdl))


@triton.jit
def _compact_kernel(
    k_ptr, v_ptr, rows_ptr, base_ptr, out_ptr, stride_layer, stride_slot, stride_pos, scratch,
    NUM_ROWS: tl.constexpr, WIDTH: tl.constexpr, W_PAD: tl.constexpr,
    ROW_SIZE: tl.constexpr, C_BLOCK: tl.constexpr, USE_PDL: tl.constexpr = False,
):
    wait_for_inputs(USE_PDL)
    b = tl.program_id(0).to(tl.int64)
    layer = tl.program_id(1).to(tl.int64)
    slot = tl.load(rows_ptr + b)
    if slot == scratch:  # padding rows share the scratch slot: none moves its K/V
        return
    start = tl.load(base_ptr + b * NUM_ROWS)  # the committed length before the round
    levels = tl.arange(0, W_PAD)
    in_width = levels < WIDTH
    path = tl.load(out_ptr + b * (2 + 2 * WIDTH) + 2 + WIDTH + levels, mask=in_width, other=0)
    row = layer * stride_layer + slot * stride_slot
    source = row + (start + path)[:, None] * stride_pos
    target = row + (start + levels)[:, None] * stride_pos
    for c0 in tl.static_range(0, ROW_SIZE, C_BLOCK):
        c = c0 + tl.arange(0, C_BLOCK)
        mask = in_width[:, None] & (c[None, :] < ROW_SIZE)
        k = tl.load(k_ptr + source + c[None, :], mask=mask)
        v = tl.load(v_ptr + source + c[None, :], mask=mask)
        tl.debug_barrier()  # every source read before any target is written (they overlap)
        tl.store(k_ptr + target + c[None, :], k, mask=mask)
        tl.store(v_ptr + target + c[None, :], v, mask=mask)


def compact(k: Tensor, v: Tensor, rows: Tensor, base: Tensor, out: Tensor, width: int,
            scratch: int) -> None:
    """`KVPool.compact(rows, committed, path)` with the path read from the round's output
    table `out` (B, 2 + 2W) and each row's committed length from `base` ((B*M,) the tree
    meta's prefix lengths, M per row): k, v (layers, slots, max_len, Hkv, D). The
    `scratch` slot is left alone (the padding rows')."""
    batch = rows.shape[0]
    assert k.is_contiguous() and v.is_contiguous() and k.shape == v.shape, k.shape
    num_rows = base.shape[0] // batch
    row_size = k.shape[3] * k.shape[4]
    pdl = use_pdl(k)
    _compact_kernel[(batch, k.shape[0])](
        k, v, rows.contiguous(), base, out, k.stride(0), k.stride(1), k.stride(2), scratch,
        NUM_ROWS=num_rows, WIDTH=width, W_PAD=_pow2(width), ROW_SIZE=row_size,
        C_BLOCK=min(C_BLOCK, _pow2(row_size)), USE_PDL=pdl, **launch_kwargs(pdl))
