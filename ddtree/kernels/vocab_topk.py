"""The drafter's top-K over the vocabulary in two small kernels: the K most probable
tokens of every (row, depth), most probable first, ties to the lower token id - exactly
`ddtree.tree._stable_topk`'s answer.

`_stable_topk` ranks a unique int64 key with `torch.topk`, whose radix select makes eight
passes over 64-bit keys (three kernels each, plus the key's own elementwise kernel): on the
H200 ~0.07 ms of a ~1.6 ms tree round at batch 1 and ~0.18 ms of ~2.5 at batch 8 (lease 12,
call 47: the drafter's top-K was the third cost that grows with the batch). Here:

1. `_chunk_topk_kernel`, one program per (row, chunk of CHUNK tokens): the chunk's K
   smallest keys, K rounds of a min-reduction over the chunk held in registers;
2. `_merge_topk_kernel`, one program per row: the K smallest of the row's chunk winners,
   written as token ids.

The key of token i with log-probability x is `bits(|x|) * V + i` (int64, non-negative):
ascending key order is |x| ascending (x descending, log-softmax never exceeds 0; -0.0 and
0.0 tie), then the token id ascending - the order `_stable_topk`'s key gives, so the same
tokens in the same order (tests/kernels/test_vocab_topk.py, ties and -inf included).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree.kernels.launch import launch_kwargs, use_pdl, wait_for_inputs

MIN_CHUNK = 2048  # tokens per chunk program at least
MAX_CANDIDATES = 4096  # chunk winners per row that the merge program holds at most
MAX_K = 64  # beyond this the K rounds cost more than torch.topk's passes (H200, lease 14)
_INT64_MAX = 2**63 - 1


@triton.jit
def _k_smallest(keys, out_ptr, k):
    """Stores the k smallest of `keys` (unique int64, padding INT64_MAX) at out_ptr[0..k),
    ascending; k rounds of a min-reduction."""
    for i in range(k):
        smallest = tl.min(keys, axis=0)
        tl.store(out_ptr + i, smallest)
        keys = tl.where(keys == smallest, 9223372036854775807, keys)


@triton.jit(do_not_specialize=["k"])
def _chunk_topk_kernel(logp_ptr, keys_ptr, vocab, num_chunks, k, stride_row,
                       CHUNK: tl.constexpr, USE_PDL: tl.constexpr = False):
    wait_for_inputs(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    token = chunk * CHUNK + tl.arange(0, CHUNK)
    inside = token < vocab
    logp = tl.load(logp_ptr + row * stride_row + token, mask=inside, other=0.0)
    magnitude = (logp.to(tl.int32, bitcast=True) & 0x7FFFFFFF).to(tl.int64)
    keys = tl.where(inside, magnitude * vocab + token, 9223372036854775807)
    _k_smallest(keys, keys_ptr + (row * num_chunks + chunk) * k, k)


@triton.jit(do_not_specialize=["k"])
def _merge_topk_kernel(keys_ptr, out_ptr, vocab, num_candidates, k,
                       CANDIDATES: tl.constexpr, USE_PDL: tl.constexpr = False):
    wait_for_inputs(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    index = tl.arange(0, CANDIDATES)
    keys = tl.load(keys_ptr + row * num_candidates + index, mask=index < num_candidates,
                   other=9223372036854775807)
    for i in range(k):
        smallest = tl.min(keys, axis=0)
        tl.store(out_ptr + row * k + i, smallest % vocab)  # keys are >= 0: the token id
        keys = tl.where(keys == smallest, 9223372036854775807, keys)


def chunk_size(vocab: int, k: int) -> int:
    """Tokens per chunk program: at least MIN_CHUNK, and enough that the row's chunk
    winners (one K per chunk) fit the merge program's MAX_CANDIDATES."""
    chunk = MIN_CHUNK
    while triton.cdiv(vocab, chunk) * k > MAX_CANDIDATES:
        chunk *= 2
    return chunk


def supports(vocab: int, k: int) -> bool:
    """Whether the kernels take this top-K: 1 <= k <= MAX_K, k <= vocab, and the key
    bits(|x|) * V + i fits an int64."""
    return 1 <= k <= min(MAX_K, vocab) and vocab < (1 << 31)


def stable_topk(logp: Tensor, k: int) -> Tensor:
    """Indices (..., k) int64 of the k largest values along the last dim of a float32
    logp (..., V) of log-probabilities (<= 0), largest first, ties to the lower index:
    `ddtree.tree._stable_topk`, bitwise. Static shapes, no host sync (CUDA graphs)."""
    assert logp.dtype == torch.float32, logp.dtype
    vocab = logp.shape[-1]
    assert supports(vocab, k), (vocab, k)
    rows = logp.reshape(-1, vocab)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    num_rows = rows.shape[0]
    out = torch.empty((*logp.shape[:-1], k), dtype=torch.int64, device=logp.device)
    if num_rows == 0:
        return out
    chunk = chunk_size(vocab, k)
    num_chunks = triton.cdiv(vocab, chunk)
    keys = torch.empty((num_rows, num_chunks, k), dtype=torch.int64, device=logp.device)
    pdl = use_pdl(logp)
    _chunk_topk_kernel[(num_rows, num_chunks)](
        rows, keys, vocab, num_chunks, k, rows.stride(0), CHUNK=chunk, USE_PDL=pdl,
        num_warps=8 if chunk > MIN_CHUNK else 4, **launch_kwargs(pdl))
    num_candidates = num_chunks * k
    _merge_topk_kernel[(num_rows,)](
        keys, out, vocab, num_candidates, k,
        CANDIDATES=triton.next_power_of_2(num_candidates), USE_PDL=pdl,
        num_warps=8 if num_candidates > 1024 else 4, **launch_kwargs(pdl))
    return out
