"""Tree attention over the KV pool: every query attends to its row's committed prefix
(read straight from the pool, no mask) followed by its own tree keys (its ancestors and
itself, in depth order), in LOGICAL POSITION ORDER.

The logical key sequence of query t has `prefix_len[t] + num_tree_keys[t]` entries;
entry p lives in pool row `query_slot[t]` at slot

    p                                              if p < prefix_len[t]
    tree_base[t] + tree_keys[t, p - prefix_len[t]] otherwise

Queries of every kind use this one description:
- ar step at committed length n (its own K/V already written at slot n):
  prefix_len = n + 1, num_tree_keys = 0;
- chain / tree verify at committed length n (node j's K/V written at slot n + j):
  prefix_len = n, tree_base = n, tree_keys = the node's ancestor chain root first, ending
  with the node itself (depth + 1 entries);
- causal prefill of M tokens after n committed: prefix_len = n + m + 1, no tree keys;
- the drafter's block (bidirectional): prefix_len = context length c, tree_base = c,
  tree_keys = 0..b-1 for every block query.

Batch invariance (the contract the Triton kernel must keep, bitwise): the output of query
t depends only on q[t] and the VALUES of its logical key sequence - not on T, not on the
other queries, not on how the sequence splits between prefix and tree keys, not on
`max_kv_len` or the pool row. Keys are reduced in blocks of fixed size over logical
positions [0, B), [B, 2B), ... and, for long contexts, in splits of a fixed number of
logical positions combined in split order. So a tree node's logits equal those of the
ar step that would have produced the same token.
"""

from __future__ import annotations

import collections
import functools
import re
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree.kernels.launch import (
    launch_kwargs,
    prefetch_blocks,
    prefetch_enabled,
    prefetch_l2,
    use_pdl,
    wait_for_inputs,
)
from ddtree.kernels.matmul import dot_in_float32


def logical_slots(
    prefix_len: Tensor, tree_base: Tensor, tree_keys: Tensor, num_tree_keys: Tensor,
    length: int,
) -> tuple[Tensor, Tensor]:
    """The pool slot of each logical key position, and whether the position exists.

    prefix_len, tree_base, num_tree_keys: (T,) int; tree_keys: (T, Kt) int.
    Returns slots (T, length) int64 (0 where invalid) and valid (T, length) bool.
    """
    positions = torch.arange(length, device=prefix_len.device)[None, :]  # (1, P)
    prefix = prefix_len.long()[:, None]  # (T, 1)
    total = prefix + num_tree_keys.long()[:, None]  # (T, 1)
    if tree_keys.shape[1] == 0:
        tree_slot = torch.zeros_like(positions).expand(prefix.shape[0], length)
    else:
        index = (positions - prefix).clamp(0, tree_keys.shape[1] - 1)  # (T, P)
        tree_slot = tree_base.long()[:, None] + tree_keys.long().gather(1, index)
    slots = torch.where(positions < prefix, positions, tree_slot)  # (T, P)
    valid = positions < total
    return torch.where(valid, slots, 0), valid


def tree_attention_reference(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, query_slot: Tensor, prefix_len: Tensor,
    tree_base: Tensor, tree_keys: Tensor, num_tree_keys: Tensor, scale: float,
    compute_dtype: torch.dtype = torch.float32, length: int | None = None,
) -> Tensor:
    """Plain PyTorch: gathers each query's logical keys, softmax in `compute_dtype`.

    q: (T, Hq, D); k_cache, v_cache: (num_slots, max_len, Hkv, D) (one layer of the pool);
    query_slot, prefix_len, tree_base, num_tree_keys: (T,) int; tree_keys: (T, Kt) int.
    Every query must have at least one key. Returns (T, Hq, D) in q's dtype. `length`
    bounds the keys per query; None reads the longest from the tensors (a host sync).
    """
    num_queries, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if length is None:
        length = int((prefix_len.long() + num_tree_keys.long()).max())
    slots, valid = logical_slots(prefix_len, tree_base, tree_keys, num_tree_keys, length)
    rows = query_slot.long()[:, None].expand(num_queries, length)  # (T, P)
    keys = k_cache[rows, slots].to(compute_dtype)  # (T, P, Hkv, D)
    values = v_cache[rows, slots].to(compute_dtype)  # (T, P, Hkv, D)
    group = num_heads // num_kv_heads
    queries = q.to(compute_dtype).view(num_queries, num_kv_heads, group, head_dim)
    scores = torch.einsum("tkgd,tpkd->tkgp", queries, keys) * scale  # (T, Hkv, G, P)
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("tkgp,tpkd->tkgd", probs, values)  # (T, Hkv, G, D)
    return out.reshape(num_queries, num_heads, head_dim).to(q.dtype)


# ---------------------------------------------------------------------------------------
# Triton kernel. Invariance comes from fixed constants: keys are reduced in blocks of
# BLOCK_N logical positions starting at multiples of BLOCK_N, inside splits of SPLIT_SIZE
# logical positions starting at multiples of SPLIT_SIZE, and splits are merged in split
# order. A query whose sequence fits one split is normalised in the split kernel; a longer
# one always goes through the combine kernel. Both choices depend on the query's own length
# only, never on max_kv_len or T. The split kernel walks whole prefix blocks in one loop and
# the rest in a second; both run the same `_attend_block`, so a block gives the same bits in
# either (an ar query reaches in its first loop a block that its tree twin reaches in its
# second; the sm_90 PTX of the two loop bodies holds the same float ops, which the kernel
# checks at the first launch of each compiled variant: `split_loops_agree`).

BLOCK_N = 64  # logical positions per key block
SPLIT_SIZE = 256  # logical positions per split (a multiple of BLOCK_N; 256 measured faster
#   than 512 for the short contexts of decoding on the H200, 2026-12-01; 128 and 64 made the
#   8B ar step 1-2% faster and its 64-node verify 6-21% slower, lease 15)
# head dim -> (BLOCK_N, num_warps, num_stages) of the split kernel: constants of the model's
# shape, never of the batch (another tiling gives other bits: one tiling serves every query
# of a model). Lease 15's sweep (scripts/gpu/attn_sweep.py): at head dim 64, 64 / 2 / 2
# makes batches of trees 13-19% faster and one decode query 7% slower; in process (lease
# 16, 40 HumanEval requests) tree@16 +3% / +6% at c1 / c8, ar -1%. Its 2 samples "leaving
# ar" in lease 15 were one extra token past max_tokens (Row.emit), not the kernel: every
# mode equals ar under it (lease 16's exact stage, 40 prompts). At 128, 64 / 4 / 2 made the
# 8B verify of 64 nodes 5% faster and decode at 4,096 keys 25% slower: not taken as the
# tiling; wide launches take its 2 stages (WIDE_STAGES below).
ATTN_TILES = {64: (BLOCK_N, 2, 2), 128: (BLOCK_N, 4, 3)}
# head dim -> the split kernel's stages for a wide launch: more (query, KV head) pairs than
# the device has SMs, so several programs share an SM and occupancy counts for more than
# the depth of one program's K/V pipeline. The stage count moves no float operation (the
# PTX's float-op sequence of every stage count is the same, sm_90, triton 3.6 and 3.9;
# the kernel checks it at the first wide launch: `stages_agree`), so a wide launch's
# queries keep their bits and a tree node still equals its ar twin launched alone. At head
# dim 128 2 stages hold 156 registers and 39 KB of shared memory a program (3: 201 and
# 72 KB; triton 3.6): three programs an SM against two. Lease 15's sweep (before query
# groups, 122 / 164 registers): one tree of 64 nodes at 512 keys 34.6 us against 42.4,
# eight trees 261.8 against 331.0; one query at 4,096 keys 14.3 against 11.4 (a narrow
# launch: keeps 3). Head dim 64 keeps its 2 everywhere.
WIDE_STAGES = {128: 2}
_wide_stages_enabled = True
# Query groups (2026-12-04): a tree's nodes (a drafter block's queries, a prefill chunk's
# tokens) share their row's prefix, and one query a program read it once per query: a
# tree of 64 nodes at 512 keys ran 8 x 64 x 2 programs of 4 prefix blocks each, ~3 waves
# on an H200 (42.4 us a layer, the 8B verify's main cost over an ar step). Consecutive
# queries come in groups of GROUP_PAD // G (Qwen3-8B: 4 queries x 4 heads, SmolLM2: 5 x 3
# of the 16 rows of the dot): a split inside every member's prefix (same pool row) is done
# once for the group by its first query's program, the members' rows side by side in one
# dot; the splits holding tree keys stay one query a program, in parallel (an earlier
# group kernel ran those query after query and lost, lease 17). Each row's arithmetic is
# the ungrouped one (rows of a dot do not mix; the PTX of every key loop holds the same
# float ops, `split_loops_agree`), so a grouped node still equals its ar twin. Decoding
# launches (one query a pool row: AttentionMeta.queries_per_row 1) run the kernel without
# groups (fewer registers), whose key loops a grouped kernel is checked against.
_query_groups_enabled = True
PREFIX_LOOP = True  # whole prefix blocks in their own loop (pipelined); False: one loop
# Split programs a launch aims at (queries x KV heads x programs a query): a query's splits
# beyond its programs are taken in turn by them. The grid is sized from max_kv_len (a CUDA
# graph's grid is fixed), so at the served model length (SmolLM2: 8,192, 33 splits) most
# programs found no keys: at 8 trees of 17 nodes 13,464 programs, ~6 waves on an H200, most
# of them idle, and the split kernel took 21 us a layer against 11.5 with 5 splits (lease
# 31, round traces of the verifier service and in process). A query with 1-4 splits, as in
# decoding a short context, still gets one program a split. With this, tree@16 at c8
# through `ddtree serve` rose 11-13% (lease 32); c1 and in process did not move.
SPLIT_PROGRAMS = 2048
# A dependent launch's prefix prefetch (PREFETCH_BUDGET_BYTES over the launch) is shared
# by the splits a query's prefix fills, not by the grid's: sized from max_kv_len, the grid
# of a row of 8,192 tokens (33 splits) left each split of ar c8's ~400-token contexts one
# block (64 positions) ahead instead of all 256. On an H100 (lease 50, ar c8 as MPS
# clients) its verify took 0.785 ms a round in process and 0.782 through `ddtree serve`,
# 0.758 and 0.754 with this (rows of the run's length: 0.751).
MIN_DOT_ROWS = 16  # tl.dot needs M >= 16: the G query heads of a KV head are padded to it
LOG2_E = 1.4426950408889634


def set_wide_stages(enabled: bool) -> bool:
    """Turns the wide launches' stage count (WIDE_STAGES) on or off for launches from now
    on (benchmarks' A/B); returns the old setting. CUDA graphs keep what they captured."""
    global _wide_stages_enabled
    previous, _wide_stages_enabled = _wide_stages_enabled, bool(enabled)
    return previous


def set_query_groups(enabled: bool) -> bool:
    """Turns query groups (see above) on or off for launches from now on (benchmarks'
    A/B; no bit moves); returns the old setting. CUDA graphs keep what they captured."""
    global _query_groups_enabled
    previous, _query_groups_enabled = _query_groups_enabled, bool(enabled)
    return previous


@functools.lru_cache(maxsize=16)
def _num_sms(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def launch_stages(head_dim: int, num_queries: int, num_kv_heads: int, num_stages: int,
                  device: torch.device) -> int:
    """The split kernel's stages for a launch of `num_queries` queries: the head dim's
    WIDE_STAGES where the (query, KV head) pairs outnumber the device's SMs, else
    `num_stages`. From shapes alone (a CUDA graph's launch is fixed), and never a change of
    bits (see WIDE_STAGES)."""
    wide = WIDE_STAGES.get(head_dim)
    if wide is None or not _wide_stages_enabled or device.type != "cuda":
        return num_stages
    index = torch.cuda.current_device() if device.index is None else device.index
    return wide if num_queries * num_kv_heads > _num_sms(index) else num_stages


def _float_ops(lines: list[str]) -> list[str]:
    """The opcodes of the float arithmetic (and the shuffles and matrix ops that feed it)
    among PTX lines, in order."""
    ops = []
    for line in lines:
        words = line.split()
        if not words or words[0].startswith("//"):
            continue
        opcode = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
        if (opcode.startswith(("mma", "wgmma", "shfl", "ex2"))
                or any(kind in opcode for kind in (".f32", ".f16", ".bf16", ".f64"))):
            ops.append(opcode.rstrip(";"))
    return ops


def _loop_float_ops(ptx: str) -> list[collections.Counter[str]]:
    """The float-op multisets of a PTX's innermost loops that do float arithmetic (each a
    span that a backward branch closes, holding no other)."""
    lines = ptx.splitlines()
    labels = {match.group(1): i for i, line in enumerate(lines)
              for match in [re.match(r"\s*(\$?[\w$]+):", line)] if match}
    spans = []
    for i, line in enumerate(lines):
        match = re.search(r"\bbra(?:\.uni)?\s+(\$?[\w$]+);", line)
        if match and labels.get(match.group(1), i) < i:
            spans.append((labels[match.group(1)], i))
    # the innermost loops: the key loops (the loop over a query's splits holds them)
    inner = [(a, b) for a, b in spans
             if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in spans)]
    loops = [_float_ops(lines[a:b]) for a, b in inner]
    return [collections.Counter(loop) for loop in loops if loop]  # not the L2 prefetch's


def split_loops_agree(ptx: str, *twins: str) -> bool:
    """Whether the split kernel's innermost loops that do float arithmetic run the same
    float operations: the key loops (a group's prefix loop, a query's prefix loop and its
    tree-key loop) must, for a key block to give the same bits whichever loop reaches it
    (an ar query reaches in its first loop a block its tree twin reaches in its second, or
    in its group's); with `twins`, the loops of those compiled variants too (a launch
    without query groups against one with them).
    Compared as multisets: the scheduler may order independent operations differently in
    the two loops (triton 3.9 does so for float32 at head dim 128), which changes no
    result. Necessary, not sufficient (the twin checks of scripts/gpu/attn_sweep.py and the
    exact stage on the GPU are the evidence)."""
    counts = [count for text in (ptx, *twins) for count in _loop_float_ops(text)]
    return all(count == counts[0] for count in counts[1:])


def stages_agree(ptx: str, twin_ptx: str) -> bool:
    """Whether two compiled variants of the split kernel that differ in their stage count
    run the same float operations in the same order (the whole kernel's PTX): the stage
    count only schedules the K/V loads. Necessary, not sufficient (the twin checks of
    scripts/gpu/attn_sweep.py across stage counts and the 8B shapes' tokens against ar's on
    the GPU are the evidence)."""
    return _float_ops(ptx.splitlines()) == _float_ops(twin_ptx.splitlines())


_CHECKED: dict[tuple[int, str], bool] = {}


def _ptx(kernel: object) -> str | None:
    """A compiled kernel's PTX (None for the interpreter's kernels, which carry none)."""
    asm = getattr(kernel, "asm", None)
    return asm["ptx"] if isinstance(asm, dict) and "ptx" in asm else None


def _refuse_unless(kernel: object, what: str, agree: Callable[[str], bool]) -> None:
    """Refuses a compiled split kernel for which `agree` (on its PTX) is false: its queries
    would not keep the bits their ar twins have. Checked once per compiled variant and
    `what`; nothing to check on the interpreter."""
    ptx = _ptx(kernel)
    if ptx is None:
        return
    key = (id(kernel), what)
    if key not in _CHECKED:
        _CHECKED[key] = agree(ptx)
    if not _CHECKED[key]:
        raise RuntimeError(
            f"tree attention {what}: the compiled kernel's float operations differ where "
            "they must not (split_loops_agree / stages_agree), so a tree query would not "
            "equal its ar twin; use another tiling (or WIDE_STAGES / set_query_groups(False) "
            "for the variant)")


@triton.jit
def _attend_block(q, k_base, v_base, slot, valid, m_i, l_i, acc, scale_log2, stride_kp,
                  stride_vp, HEAD_DIM: tl.constexpr, DOT_IEEE: tl.constexpr):
    """One block of keys into the online softmax: the same code, so the same arithmetic,
    in both loops of the split kernel. slot: (BLOCK,) int64 pool slots; valid: (BLOCK,)."""
    dims = tl.arange(0, HEAD_DIM)
    k = tl.load(k_base + slot[None, :] * stride_kp + dims[:, None],
                mask=valid[None, :], other=0.0)  # (D, BLOCK)
    if DOT_IEEE:
        scores = tl.dot(q.to(tl.float32), k.to(tl.float32), input_precision="ieee")
    else:
        scores = tl.dot(q, k)
    scores = tl.where(valid[None, :], scores * scale_log2, float("-inf"))  # (G_pad, BLOCK)
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(scores - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_base + slot[:, None] * stride_vp + dims[None, :],
                mask=valid[:, None], other=0.0)  # (BLOCK, D)
    if DOT_IEEE:  # p rounded to v's dtype first, as on the tensor-core path
        pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def _prefetch_prefix(k_ptr, v_ptr, query_slot_ptr, prefix_len_ptr, t, kv_head, start,
                     num_positions, num_slots, pool_len, stride_ks, stride_kp, stride_kh, stride_vs,
                     stride_vp, stride_vh, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
                     SPLIT: tl.constexpr, LINES: tl.constexpr):
    """L2 prefetches of the K and V rows (LINES 128-byte lines each) of the first prefix
    positions from `start` (within the split) of query t's pool row, before the kernel
    waits for the previous one: `num_positions` a query (the launch's budget) shared by
    the splits its prefix fills, whole blocks, at least one. Only addresses depend on the
    metadata read here: the slot and positions are clamped into the pool, so the prefetch
    is harmless even if the metadata were not yet final (the real loads follow the wait)."""
    slot = tl.minimum(tl.maximum(tl.load(query_slot_ptr + t).to(tl.int64), 0), num_slots - 1)
    prefix = tl.minimum(tl.maximum(tl.load(prefix_len_ptr + t).to(tl.int32), 0), pool_len)
    splits = tl.cdiv(tl.maximum(prefix, 1), SPLIT)
    per_split = tl.maximum(num_positions // splits // BLOCK * BLOCK, BLOCK)
    end = tl.minimum(prefix, start + tl.minimum(per_split, SPLIT))
    k_base = k_ptr + slot * stride_ks + kv_head * stride_kh
    v_base = v_ptr + slot * stride_vs + kv_head * stride_vh
    line = tl.arange(0, LINES) * (HEAD_DIM // LINES)  # (LINES,) first element of each line
    for block_start in range(start, end, BLOCK):
        pos = tl.minimum(block_start + tl.arange(0, BLOCK), end - 1).to(tl.int64)  # (BLOCK,)
        prefetch_l2(k_base + pos[:, None] * stride_kp + line[None, :])
        prefetch_l2(v_base + pos[:, None] * stride_vp + line[None, :])


@triton.jit(do_not_specialize=["num_tree_cols", "stride_tree", "num_splits", "num_programs",
                             "num_prefetch", "num_slots", "pool_len"])
def _tree_attention_split_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, ws_acc_ptr, ws_stat_ptr,
    query_slot_ptr, prefix_len_ptr, tree_base_ptr, tree_keys_ptr, num_tree_keys_ptr,
    scale_log2, num_tree_cols, stride_tree,
    stride_qt, stride_qh, stride_ks, stride_kp, stride_kh, stride_vs, stride_vp, stride_vh,
    stride_ot, stride_oh, num_splits, num_programs,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, SPLIT: tl.constexpr,
    DOT_IEEE: tl.constexpr, PREFIX_LOOP: tl.constexpr, USE_PDL: tl.constexpr = False,
    PREFETCH_LINES: tl.constexpr = 0, num_prefetch=0, num_slots=1, pool_len=1,
    QUERY_GROUP: tl.constexpr = 1, MEMBERS_PAD: tl.constexpr = 1,
):
    """Program (t, kv_head, p) attends query t's splits p, p + num_programs, ... (each
    split as it would alone: the bits do not depend on num_programs). With QUERY_GROUP > 1
    the queries come in groups of QUERY_GROUP consecutive ones (see set_query_groups): a split
    that lies inside the prefix of every member of a group of one pool row is computed by
    the group's first query's program for all members at once, through one dot of
    QUERY_GROUP x GROUP rows (each row as it would be alone: rows do not mix); the other
    members' programs skip it."""
    t = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    first_split = tl.program_id(2)
    if PREFETCH_LINES > 0:  # dependent launch: its first split's prefix K/V lines into L2
        _prefetch_prefix(k_ptr, v_ptr, query_slot_ptr, prefix_len_ptr, t, kv_head,
                         first_split * SPLIT, num_prefetch, num_slots, pool_len, stride_ks,
                         stride_kp, stride_kh, stride_vs, stride_vp, stride_vh, HEAD_DIM,
                         BLOCK, SPLIT, PREFETCH_LINES)
    wait_for_inputs(USE_PDL)
    prefix = tl.load(prefix_len_ptr + t).to(tl.int32)
    total = prefix + tl.load(num_tree_keys_ptr + t).to(tl.int32)
    # A query with no keys still gets its split 0 (it writes zeros, never NaN).
    query_splits = tl.cdiv(tl.maximum(total, 1), SPLIT)
    if first_split >= query_splits:
        return
    tree_base = tl.load(tree_base_ptr + t).to(tl.int32)
    k_base = k_ptr + tl.load(query_slot_ptr + t).to(tl.int64) * stride_ks + kv_head * stride_kh
    v_base = v_ptr + tl.load(query_slot_ptr + t).to(tl.int64) * stride_vs + kv_head * stride_vh

    rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + rows  # (G_pad,)
    head_mask = rows < GROUP
    q = tl.load(q_ptr + t * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                mask=head_mask[:, None], other=0.0)  # (G_pad, D)

    # The group's shared splits: those inside every member's prefix (the same keys for
    # all, slot == position) when the members share a pool row and each has more than one
    # split (so each goes through the combine); 0 where the group is one query or mixed.
    shared_splits = 0
    leader = t
    if QUERY_GROUP > 1:
        leader = t - t % QUERY_GROUP
        member = tl.arange(0, MEMBERS_PAD)
        index = leader + member
        in_group = (member < QUERY_GROUP) & (index < tl.num_programs(0))
        slot_of = tl.load(query_slot_ptr + index, mask=in_group, other=0).to(tl.int64)
        prefix_of = tl.load(prefix_len_ptr + index, mask=in_group, other=0).to(tl.int32)
        total_of = prefix_of + tl.load(num_tree_keys_ptr + index, mask=in_group,
                                       other=0).to(tl.int32)
        leader_slot = tl.load(query_slot_ptr + leader).to(tl.int64)
        others = tl.sum((in_group & (slot_of != leader_slot)).to(tl.int32))  # other rows
        big = 2147483647
        min_prefix = tl.min(tl.where(in_group, prefix_of, big))
        min_total = tl.min(tl.where(in_group, total_of, big))
        shared_splits = tl.where((tl.sum(in_group.to(tl.int32)) > 1) & (others == 0)
                                 & (min_total > SPLIT), min_prefix // SPLIT, 0)
        # row r of a shared split's dot: member r // GROUP, that member's head r % GROUP
        row_member = rows // GROUP
        row_query = leader + row_member
        row_head = kv_head * GROUP + rows % GROUP
        row_real = (row_member < QUERY_GROUP) & (row_query < tl.num_programs(0))
        q_group = tl.load(q_ptr + row_query[:, None] * stride_qt
                          + row_head[:, None] * stride_qh + dims[None, :],
                          mask=row_real[:, None], other=0.0)  # (G_pad, D)
        ws_group = row_query * num_splits * NUM_HEADS + row_head  # (G_pad,) int64

    for split in range(first_split, query_splits, num_programs):
        if QUERY_GROUP > 1:
            if (split < shared_splits) & (t == leader):  # the group's: its leader does it
                start = split * SPLIT
                m_g = tl.full([GROUP_PAD], float("-inf"), tl.float32)
                l_g = tl.zeros([GROUP_PAD], tl.float32)
                acc_g = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
                for block_start in range(start, start + SPLIT, BLOCK):
                    pos = block_start + tl.arange(0, BLOCK)
                    m_g, l_g, acc_g = _attend_block(q_group, k_base, v_base, pos.to(tl.int64),
                                                    pos < start + SPLIT, m_g, l_g, acc_g,
                                                    scale_log2, stride_kp, stride_vp,
                                                    HEAD_DIM, DOT_IEEE)
                ws_row = ws_group + split * NUM_HEADS
                tl.store(ws_acc_ptr + ws_row[:, None] * HEAD_DIM + dims[None, :], acc_g,
                         mask=row_real[:, None])
                tl.store(ws_stat_ptr + ws_row * 2, m_g, mask=row_real)
                tl.store(ws_stat_ptr + ws_row * 2 + 1, l_g, mask=row_real)
        if split >= shared_splits:  # this query's own split
            start = split * SPLIT
            end = tl.minimum(start + SPLIT, total)
            m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
            l_i = tl.zeros([GROUP_PAD], tl.float32)
            acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
            tail_start = start
            if PREFIX_LOOP:  # whole blocks of prefix first: slot == position, no index load,
                # so the pipeliner double-buffers K/V (an index load in the loop keeps it at one)
                whole = tl.maximum(tl.minimum(end, prefix) - start, 0) // BLOCK * BLOCK
                tail_start = start + whole
                for block_start in range(start, tail_start, BLOCK):
                    pos = block_start + tl.arange(0, BLOCK)  # (BLOCK,) logical positions
                    m_i, l_i, acc = _attend_block(q, k_base, v_base, pos.to(tl.int64),
                                                  pos < end, m_i, l_i, acc, scale_log2,
                                                  stride_kp, stride_vp, HEAD_DIM, DOT_IEEE)
            for block_start in range(tail_start, end, BLOCK):
                pos = block_start + tl.arange(0, BLOCK)
                tree_col = pos - prefix
                is_tree = tree_col >= 0
                tree_key = tl.load(tree_keys_ptr + t * stride_tree + tree_col,
                                   mask=(pos < end) & is_tree & (tree_col < num_tree_cols),
                                   other=0)
                slot = tl.where(is_tree, tree_base + tree_key.to(tl.int32), pos).to(tl.int64)
                m_i, l_i, acc = _attend_block(q, k_base, v_base, slot, pos < end, m_i, l_i,
                                              acc, scale_log2, stride_kp, stride_vp, HEAD_DIM,
                                              DOT_IEEE)

            if total <= SPLIT:
                out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
                tl.store(out_ptr + t * stride_ot + heads[:, None] * stride_oh + dims[None, :],
                         out.to(out_ptr.dtype.element_ty), mask=head_mask[:, None])
            else:
                ws_row = (t * num_splits + split) * NUM_HEADS + heads  # (G_pad,) int64
                tl.store(ws_acc_ptr + ws_row[:, None] * HEAD_DIM + dims[None, :], acc,
                         mask=head_mask[:, None])
                tl.store(ws_stat_ptr + ws_row * 2, m_i, mask=head_mask)
                tl.store(ws_stat_ptr + ws_row * 2 + 1, l_i, mask=head_mask)


@triton.jit(do_not_specialize=["num_splits"])
def _tree_attention_combine_kernel(
    out_ptr, ws_acc_ptr, ws_stat_ptr, prefix_len_ptr, num_tree_keys_ptr,
    stride_ot, stride_oh, num_splits,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, SPLIT: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    wait_for_inputs(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    total = (tl.load(prefix_len_ptr + t).to(tl.int32)
             + tl.load(num_tree_keys_ptr + t).to(tl.int32))
    if total <= SPLIT:
        return
    dims = tl.arange(0, HEAD_DIM)
    m_i = tl.load(ws_stat_ptr + (t * num_splits * NUM_HEADS + head) * 2)
    l_i = tl.zeros_like(m_i)
    acc = tl.zeros([HEAD_DIM], tl.float32)
    for split in range(0, tl.cdiv(total, SPLIT)):  # in split order: a fixed sum order
        ws_row = (t * num_splits + split) * NUM_HEADS + head
        m_s = tl.load(ws_stat_ptr + ws_row * 2)
        l_s = tl.load(ws_stat_ptr + ws_row * 2 + 1)
        a_s = tl.load(ws_acc_ptr + ws_row * HEAD_DIM + dims)
        m_new = tl.maximum(m_i, m_s)
        alpha = tl.exp2(m_i - m_new)
        beta = tl.exp2(m_s - m_new)
        l_i = l_i * alpha + l_s * beta
        acc = acc * alpha + a_s * beta
        m_i = m_new
    tl.store(out_ptr + t * stride_ot + head * stride_oh + dims,
             (acc / l_i).to(out_ptr.dtype.element_ty))


def tree_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, query_slot: Tensor, prefix_len: Tensor,
    tree_base: Tensor, tree_keys: Tensor, num_tree_keys: Tensor, scale: float,
    max_kv_len: int, tiles: tuple[int, int, int] | None = None,
    query_group: int | None = None,
) -> Tensor:
    """The Triton kernel of `tree_attention_reference` (same arguments; softmax in float32).

    q: (T, Hq, D) contiguous; k_cache, v_cache: (num_slots, max_len, Hkv, D), last dim
    contiguous (a `pool[layer]` view); query_slot, prefix_len, tree_base, num_tree_keys:
    (T,) int32/int64; tree_keys: (T, Kt) int32/int64, row-contiguous. `max_kv_len` bounds
    prefix_len + num_tree_keys and only sizes the grid (CUDA graphs: the grid may not
    depend on tensor values). A query with no keys gets zeros. Returns (T, Hq, D).
    `tiles` (BLOCK_N, warps, stages) replaces the head dim's ATTN_TILES (experiments);
    `query_group` 1 runs the kernel without query groups (decoding: one query a pool row).
    """
    block_n, num_warps, num_stages = tiles or ATTN_TILES.get(q.shape[2], (BLOCK_N, 4, 3))
    stages = num_stages if tiles else launch_stages(q.shape[2], q.shape[0], k_cache.shape[2],
                                                    num_stages, q.device)
    return tree_attention_tiled(q, k_cache, v_cache, query_slot, prefix_len, tree_base,
                                tree_keys, num_tree_keys, scale, max_kv_len, block_n,
                                SPLIT_SIZE, PREFIX_LOOP, num_warps, stages,
                                twin_stages=num_stages, query_group=query_group)


def tree_attention_tiled(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, query_slot: Tensor, prefix_len: Tensor,
    tree_base: Tensor, tree_keys: Tensor, num_tree_keys: Tensor, scale: float,
    max_kv_len: int, block_n: int, split_size: int, prefix_loop: bool = PREFIX_LOOP,
    num_warps: int = 4, num_stages: int = 3, split_programs: int = SPLIT_PROGRAMS,
    twin_stages: int | None = None, query_group: int | None = None,
) -> Tensor:
    """`tree_attention` with explicit block and split sizes, loop structure, warps and
    stages (the tests use small sizes to cross their boundaries at short lengths; the GPU
    sweep times others). Outputs agree bitwise only between launches with the same block,
    split, loop and warp settings; `split_programs` (how many programs the splits are
    spread over) changes no bit, nor does the stage count, which a launch with
    `twin_stages` other than `num_stages` checks on the compiled code (`stages_agree`).
    `query_group`: queries a group (1: none; default: as many as fill the dot's rows,
    while query groups are on), which changes no bit either."""
    _check_arguments(q, k_cache, v_cache, query_slot, prefix_len, tree_base, tree_keys,
                     num_tree_keys, max_kv_len)
    assert block_n >= 16 and split_size % block_n == 0, (block_n, split_size)
    num_queries, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    num_splits = triton.cdiv(max_kv_len, split_size)
    out = torch.empty_like(q)
    if num_queries == 0:
        return out
    if num_splits > 1:
        ws_acc = q.new_empty((num_queries, num_splits, num_heads, head_dim), dtype=torch.float32)
        ws_stat = q.new_empty((num_queries, num_splits, num_heads, 2), dtype=torch.float32)
    else:  # every query fits one split: the workspace is never touched
        ws_acc = ws_stat = q.new_empty((1,), dtype=torch.float32)
    num_tree_cols = tree_keys.shape[1]
    pdl = use_pdl(q)
    # 128-byte lines per K (or V) row, for the prefix prefetch of a dependent launch
    lines = max(1, head_dim * k_cache.element_size() // 128) if pdl and prefetch_enabled() else 0
    # prefix positions a query asks for ahead within the L2 budget (K and V of every
    # query), shared by the splits its prefix fills (in the kernel)
    num_prefetch = block_n * prefetch_blocks(
        2 * num_queries * num_kv_heads * block_n * head_dim * k_cache.element_size(),
        num_splits * split_size // block_n)
    if num_tree_cols == 0:  # never read (masked), but the kernel needs a real pointer
        tree_keys = tree_keys.new_empty((num_queries, 1))
    # programs a query: every split its own up to SPLIT_PROGRAMS programs in all
    num_programs = min(num_splits, max(1, triton.cdiv(split_programs,
                                                      num_queries * num_kv_heads)))
    group_pad = max(MIN_DOT_ROWS, triton.next_power_of_2(group))
    if query_group is None:
        query_group = group_pad // group if _query_groups_enabled else 1
    assert 1 <= query_group * group <= group_pad, (query_group, group, group_pad)
    grid = (num_queries, num_kv_heads, num_programs)
    args = (q, k_cache, v_cache, out, ws_acc, ws_stat,
            query_slot, prefix_len, tree_base, tree_keys, num_tree_keys,
            scale * LOG2_E, num_tree_cols, tree_keys.stride(0),
            q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3],
            out.stride(0), out.stride(1), num_splits, num_programs)
    options = dict(
        GROUP=group, GROUP_PAD=group_pad, QUERY_GROUP=query_group,
        MEMBERS_PAD=triton.next_power_of_2(query_group), NUM_HEADS=num_heads,
        HEAD_DIM=head_dim, BLOCK=block_n, SPLIT=split_size,
        DOT_IEEE=dot_in_float32(q), PREFIX_LOOP=prefix_loop, USE_PDL=pdl,
        PREFETCH_LINES=lines, num_prefetch=num_prefetch, num_slots=k_cache.shape[0],
        pool_len=k_cache.shape[1], num_warps=num_warps, **launch_kwargs(pdl))
    kernel = _tree_attention_split_kernel[grid](*args, num_stages=num_stages, **options)

    def twin_ptx(**changes: Any) -> str:  # another variant's PTX, compiled, not launched
        return _ptx(_tree_attention_split_kernel.warmup(
            *args, grid=grid, **{"num_stages": num_stages, **options, **changes})) or ""

    what = f"with BLOCK_N={block_n}, {num_warps} warps, {num_stages} stages"
    _refuse_unless(kernel, what, split_loops_agree)  # its own key loops
    if twin_stages is not None and twin_stages != num_stages:  # a wide launch's stages
        _refuse_unless(kernel, f"{what} (twin: {twin_stages})",
                       lambda ptx: stages_agree(ptx, twin_ptx(num_stages=twin_stages)))
    if query_group > 1:  # its key loops against those of the kernel without groups
        _refuse_unless(kernel, f"{what} in groups of {query_group}", lambda ptx: (
            split_loops_agree(ptx, twin_ptx(num_stages=twin_stages or num_stages,
                                            QUERY_GROUP=1, MEMBERS_PAD=1))))
    if num_splits > 1:
        _tree_attention_combine_kernel[(num_queries, num_heads)](
            out, ws_acc, ws_stat, prefix_len, num_tree_keys,
            out.stride(0), out.stride(1), num_splits,
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, SPLIT=split_size, USE_PDL=pdl,
            num_warps=1, **launch_kwargs(pdl),
        )
    return out


def _check_arguments(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, query_slot: Tensor, prefix_len: Tensor,
    tree_base: Tensor, tree_keys: Tensor, num_tree_keys: Tensor, max_kv_len: int,
) -> None:
    assert q.dim() == 3 and q.is_contiguous(), "q must be a contiguous (T, Hq, D)"
    assert q.dtype in (torch.bfloat16, torch.float16, torch.float32), q.dtype
    num_queries, num_heads, head_dim = q.shape
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        assert cache.dim() == 4 and cache.shape[3] == head_dim, f"{name}: {cache.shape}"
        assert cache.stride(3) == 1, f"{name}: the head dim must be contiguous"
        assert cache.dtype == q.dtype and cache.device == q.device, f"{name}: {cache.dtype}"
    assert k_cache.shape == v_cache.shape, (k_cache.shape, v_cache.shape)
    assert head_dim in (64, 128), f"head dim {head_dim}: the kernel is built for 64 and 128"
    assert num_heads % k_cache.shape[2] == 0, "Hq must be a multiple of Hkv"
    for name, meta in (("query_slot", query_slot), ("prefix_len", prefix_len),
                       ("tree_base", tree_base), ("num_tree_keys", num_tree_keys)):
        assert meta.shape == (num_queries,), f"{name}: {meta.shape}"
        assert meta.dtype in (torch.int32, torch.int64) and meta.is_contiguous(), name
        assert meta.device == q.device, name
    assert tree_keys.dim() == 2 and tree_keys.shape[0] == num_queries, tree_keys.shape
    assert tree_keys.dtype in (torch.int32, torch.int64) and tree_keys.device == q.device
    assert tree_keys.shape[1] == 0 or tree_keys.stride(1) == 1, "tree_keys rows contiguous"
    assert max_kv_len >= 1, max_kv_len
