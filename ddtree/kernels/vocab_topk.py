"""The drafter's top-K over the vocabulary in small one-warp kernels: the K largest logits
of every (row, depth), largest first, ties to the lower token id - exactly
`ddtree.tree._stable_topk`'s answer - and each row's log-sum-exp, in the same passes.

`_stable_topk` ranks a unique int64 key with `torch.topk`, whose radix select makes eight
passes over 64-bit keys (three kernels each, plus the key's own elementwise kernel): on the
H200 ~0.07 ms of a ~1.6 ms tree round at batch 1 and ~0.18 ms of ~2.5 at batch 8 (lease 12,
call 47: the drafter's top-K was the third cost that grows with the batch). Here a
tournament of one-warp programs (a warp reduces with shuffles alone, no shared memory):

1. `_leaf_topk_kernel`, one program per (row, LEAF_CHUNK tokens): the chunk's best
   next_power_of_2(K) keys, in registers, and the chunk's max m and sum(exp(x - m));
2. `_merge_topk_kernel`, one program per (row, MERGE_CHUNK winners), as many levels as it
   takes to leave one list: the best of its candidates; the last level writes token ids
   and the row's log-sum-exp from its leaves' partials (in leaf order: one row's value
   never depends on the batch).

The tree needs the log-probabilities of the K winners only: logit - log-sum-exp (the
log-softmax is monotone, so its top K are the logits' top K). So no (rows, V) tensor of
log-probabilities is written or read again: at the 8B shapes (15 x 151,936) PyTorch's
log-softmax kernel, one block a row, was 42 us of a 1.22 ms drafter block (lease 37).

Inside a program the selection is K rounds of a max-reduction below BITONIC_FROM_K, and
Triton's bitonic top-K (tl.topk) from there: on the H200 (lease 14, graph replay, 15 depths
x 49,152 tokens) K = 16 took 21.0 us by rounds and 35.8 bitonic, K = 63 87.6 and 50.5,
against torch.topk's 98.7 and 104.5 (71 / 87 against 273 at 120 rows for K = 16). Beyond
MAX_K torch.topk stays (a first version ran K = 127 slower than it).

The key of token i with logit x is `ordered(x) * V + (V - 1 - i)` (int64, padding
INT64_MIN), ordered(x) the float's bits made monotone as an unsigned 32-bit number (-0.0
taken as 0.0): descending key order is x descending, then the token id ascending - the
order `_stable_topk`'s key gives, so the same tokens in the same order
(tests/kernels/test_vocab_topk.py, ties, signed zeros and -inf included).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree.kernels.launch import launch_kwargs, use_pdl, wait_for_inputs

LEAF_CHUNK = 512  # tokens per leaf program (16 a lane of one warp)
MERGE_CHUNK = 2048  # candidate keys per merge program at most
MAX_K = 64  # beyond it torch.topk (a K = 127 of the first version lost to it, lease 14)
BITONIC_FROM_K = 17  # bitonic top-K (tl.topk) from this K, K max-reduction rounds below
# The tournament's shape by next_power_of_2(K) and the rows (row x depth lists) it ranks:
# (most rows, leaf chunk, (leaf warps, merge warps)), the first that holds. Lease 37
# (call 129, tests/kernels/bench_vocab_topk.py, graph replay on the H200, every shape the
# same tokens) at 15 rows, against 512/1/1: K=16 (demo vocab 49,152) 20.9 -> 15.9 us
# with 4-warp merges (71.2 -> 66.1 at 120 rows), K=32 46.9 -> 22.2 with 2,048-token
# leaves of 4 warps, K=63 (the 8B's vocab 151,936) 88.6 -> 68.4 with 1,024-token leaves
# of 2 warps (337.8 -> 297.5 at 120 rows with 4-warp merges alone). Other K keep 512/1/1.
# In the engine (lease 38, call 131): the 8B drafter block 1.271 -> 1.217 ms.
SHAPES: dict[int, tuple[tuple[int, int, tuple[int, int]], ...]] = {
    16: ((1 << 30, 512, (1, 4)),),
    32: ((32, 2048, (4, 4)),),
    64: ((32, 1024, (2, 4)), (1 << 30, 512, (1, 4))),
}
_shapes_enabled = True


def set_shapes(enabled: bool) -> bool:
    """Turns SHAPES on or off (off: 512-token one-warp leaves and merges everywhere) for
    launches from now on (benchmarks' A/B; the tokens are the same); returns the old
    setting. CUDA graphs keep what they captured."""
    global _shapes_enabled
    previous, _shapes_enabled = _shapes_enabled, bool(enabled)
    return previous


def shape(k: int, num_rows: int) -> tuple[int, tuple[int, int]]:
    """(leaf chunk, (leaf warps, merge warps)) of a top-K of k over num_rows rows."""
    if _shapes_enabled:
        for most_rows, leaf_chunk, warps in SHAPES.get(triton.next_power_of_2(k), ()):
            if num_rows <= most_rows:
                return leaf_chunk, warps
    return LEAF_CHUNK, (1, 1)


@triton.jit
def _best(keys, K: tl.constexpr, K_PAD: tl.constexpr, BITONIC: tl.constexpr):
    """The K_PAD largest of `keys` (unique int64, padding INT64_MIN), largest first: a
    bitonic top-K (log2(K_PAD) sorting stages, then halvings) or K rounds of a
    max-reduction (INT64_MIN past K)."""
    if BITONIC:
        picked = tl.topk(keys, K_PAD)
    else:
        slots = tl.arange(0, K_PAD)
        picked = tl.full([K_PAD], -9223372036854775808, tl.int64)
        for i in range(K):
            largest = tl.max(keys, axis=0)
            picked = tl.where(slots == i, largest, picked)
            keys = tl.where(keys == largest, -9223372036854775808, keys)
    return picked


@triton.jit
def _ordered_key(x, token, vocab):
    """x's unique int64 key (larger is better): the float32's bits made monotone as an
    unsigned 32-bit number (-0.0 taken as 0.0), times V, plus V - 1 - token."""
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64) + 2147483648
    return ordered * vocab + (vocab - 1 - token)


@triton.jit
def _leaf_topk_kernel(x_ptr, keys_ptr, part_ptr, vocab, num_chunks, stride_row,
                      CHUNK: tl.constexpr, K: tl.constexpr, K_PAD: tl.constexpr,
                      BITONIC: tl.constexpr, USE_PDL: tl.constexpr = False):
    wait_for_inputs(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    token = chunk * CHUNK + tl.arange(0, CHUNK)
    inside = token < vocab
    x = tl.load(x_ptr + row * stride_row + token, mask=inside, other=float("-inf"))
    # The chunk's part of the row's log-sum-exp: its max and sum(exp(x - max)).
    m = tl.max(x, axis=0)
    safe = tl.where(m == float("-inf"), 0.0, m)  # a chunk of -inf alone: sum 0, no NaN
    part = part_ptr + (row * num_chunks + chunk) * 2
    tl.store(part, m)
    tl.store(part + 1, tl.sum(tl.exp(x - safe), axis=0))
    keys = tl.where(inside, _ordered_key(x, token, vocab), -9223372036854775808)
    slots = tl.arange(0, K_PAD)
    tl.store(keys_ptr + (row * num_chunks + chunk) * K_PAD + slots,
             _best(keys, K, K_PAD, BITONIC))


@triton.jit
def _merge_topk_kernel(keys_ptr, out_ptr, part_ptr, lse_ptr, vocab, num_candidates,
                       num_chunks, num_leaves,
                       CHUNK: tl.constexpr, K: tl.constexpr, K_PAD: tl.constexpr,
                       BITONIC: tl.constexpr, FINAL: tl.constexpr,
                       PARTS_PAD: tl.constexpr, USE_PDL: tl.constexpr = False):
    wait_for_inputs(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    index = chunk * CHUNK + tl.arange(0, CHUNK)
    keys = tl.load(keys_ptr + row * num_candidates + index, mask=index < num_candidates,
                   other=-9223372036854775808)
    picked = _best(keys, K, K_PAD, BITONIC)
    slots = tl.arange(0, K_PAD)
    if FINAL:  # key % V = V - 1 - token
        tl.store(out_ptr + row * K + slots, vocab - 1 - picked % vocab, mask=slots < K)
        # The row's log-sum-exp from its leaves' (max, sum) pairs, in leaf order.
        parts = tl.arange(0, PARTS_PAD)
        inside = parts < num_leaves
        base = part_ptr + (row * num_leaves + parts) * 2
        m = tl.load(base, mask=inside, other=float("-inf"))
        s = tl.load(base + 1, mask=inside, other=0.0)
        top = tl.max(m, axis=0)
        safe = tl.where(top == float("-inf"), 0.0, top)
        scaled = tl.where(m == float("-inf"), 0.0, s * tl.exp(m - safe))
        tl.store(lse_ptr + row, safe + tl.log(tl.sum(scaled, axis=0)))
    else:
        tl.store(out_ptr + (row * num_chunks + chunk) * K_PAD + slots, picked)


def levels(vocab: int, k: int, leaf_chunk: int | None = None) -> list[tuple[int, int]]:
    """(programs per row, chunk) of each launch: the leaves (of LEAF_CHUNK tokens unless
    said), then the merges (each leaf and merge program passes on next_power_of_2(k)
    keys)."""
    k_pad = triton.next_power_of_2(k)
    leaf_chunk = leaf_chunk or LEAF_CHUNK
    out = [(triton.cdiv(vocab, leaf_chunk), leaf_chunk)]
    candidates = out[0][0] * k_pad
    while True:
        num_chunks = triton.cdiv(candidates, MERGE_CHUNK)
        out.append((num_chunks, MERGE_CHUNK if num_chunks > 1
                    else triton.next_power_of_2(candidates)))
        if num_chunks == 1:
            return out
        candidates = num_chunks * k_pad


def supports(vocab: int, k: int) -> bool:
    """Whether the kernels take this top-K: 1 <= k <= MAX_K, k <= vocab, and the key
    ordered(x) * V + V - 1 - i fits an int64."""
    return 1 <= k <= min(MAX_K, vocab) and vocab < (1 << 31)


def topk_logsumexp(x: Tensor, k: int, bitonic: bool | None = None,
                   leaf_chunk: int | None = None, warps: tuple[int, int] | None = None
                   ) -> tuple[Tensor, Tensor]:
    """Indices (..., k) int64 of the k largest values along the last dim of a float32
    x (..., V), largest first, ties to the lower index (`ddtree.tree._stable_topk`,
    bitwise), and log(sum(exp(x))) along it (..., ) float32 (torch.logsumexp to float32
    rounding: another order of the sums). Static shapes, no host sync (CUDA graphs).
    `bitonic`: the selection (default: from BITONIC_FROM_K; else K max-reduction rounds).
    `leaf_chunk` (a power of two >= next_power_of_2(k)) and `warps` (a leaf program's, a
    merge program's): the tournament's shape (default: `shape`; any gives the same tokens,
    the keys are unique; tests/kernels/bench_vocab_topk.py sweeps them)."""
    assert x.dtype == torch.float32, x.dtype
    vocab = x.shape[-1]
    assert supports(vocab, k), (vocab, k)
    rows = x.reshape(-1, vocab)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    num_rows, device = rows.shape[0], x.device
    out = torch.empty((*x.shape[:-1], k), dtype=torch.int64, device=device)
    lse = torch.empty(x.shape[:-1], dtype=torch.float32, device=device)
    if num_rows == 0:
        return out, lse
    if leaf_chunk is None or warps is None:
        default_chunk, default_warps = shape(k, num_rows)
        leaf_chunk, warps = leaf_chunk or default_chunk, warps or default_warps
    (num_leaves, leaf), *merges = levels(vocab, k, leaf_chunk)
    pdl, k_pad = use_pdl(x), triton.next_power_of_2(k)
    bitonic = k >= BITONIC_FROM_K if bitonic is None else bitonic
    keys = torch.empty((num_rows, num_leaves, k_pad), dtype=torch.int64, device=device)
    parts = torch.empty((num_rows, num_leaves, 2), dtype=torch.float32, device=device)
    _leaf_topk_kernel[(num_rows, num_leaves)](
        rows, keys, parts, vocab, num_leaves, rows.stride(0), CHUNK=leaf, K=k, K_PAD=k_pad,
        BITONIC=bitonic, USE_PDL=pdl, num_warps=warps[0], **launch_kwargs(pdl))
    for num_chunks, chunk in merges:
        final = num_chunks == 1
        dest = out if final else torch.empty((num_rows, num_chunks, k_pad), dtype=torch.int64,
                                             device=device)
        _merge_topk_kernel[(num_rows, num_chunks)](
            keys, dest, parts, lse, vocab, keys.shape[1] * k_pad, num_chunks, num_leaves,
            CHUNK=chunk, K=k, K_PAD=k_pad, BITONIC=bitonic, FINAL=final,
            PARTS_PAD=triton.next_power_of_2(num_leaves) if final else 1, USE_PDL=pdl,
            num_warps=warps[1], **launch_kwargs(pdl))
        keys = dest
    return out, lse


def stable_topk(x: Tensor, k: int, bitonic: bool | None = None,
                leaf_chunk: int | None = None, warps: tuple[int, int] | None = None) -> Tensor:
    """`topk_logsumexp`'s indices alone."""
    return topk_logsumexp(x, k, bitonic, leaf_chunk, warps)[0]
