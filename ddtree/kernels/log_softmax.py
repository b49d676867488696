"""The drafter's log-softmax over the vocabulary, for few rows: split along the row.

A draft block's logits are (rows x depths, V) float32 with few rows (15 at batch 1) and a
long vocabulary (49,152 demo, 151,936 Qwen3). PyTorch's softmax kernel gives each row one
thread block: 15 blocks on the H200's 132 SMs, 42 us a block at the 8B shapes (lease 37,
call 128's profile of the draft graph), for ~9 MB read and ~9 MB written. Here each row is
cut into CHUNK-token pieces, two kernels over (row, chunk):

1. `_partials_kernel`: a chunk's max m and sum(exp(x - m)) (one read);
2. `_normalize_kernel`: the row's log-sum-exp from its chunks' partials (a few dozen
   numbers, the same order in every program of the row), then x - lse (a second read, the
   write).

The values agree with torch.log_softmax to float32 rounding (not bitwise: another order of
the sums); everything downstream (the top-K, the tree scores) reads these one tensor, and
on the GPU `ddtree.tree.build_round_tree` takes them on every path (its PyTorch and kernel
tree builds see the same log-probabilities). The CPU keeps torch.log_softmax.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree.kernels.launch import launch_kwargs, use_pdl, wait_for_inputs

CHUNK = 4096  # tokens per program
MIN_VOCAB = 8192  # below it torch's kernel (rows of one or two chunks gain nothing)
_enabled = True


def set_enabled(enabled: bool) -> bool:
    """Turns these kernels on or off (off: torch.log_softmax on the GPU too) for launches
    from now on (benchmarks' A/B); returns the old setting. CUDA graphs keep what they
    captured."""
    global _enabled
    previous, _enabled = _enabled, bool(enabled)
    return previous


@triton.jit
def _partials_kernel(x_ptr, part_ptr, vocab, num_chunks, stride_row,
                     CHUNK: tl.constexpr, USE_PDL: tl.constexpr = False):
    wait_for_inputs(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    token = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * stride_row + token, mask=token < vocab, other=float("-inf"))
    m = tl.max(x, axis=0)
    safe = tl.where(m == float("-inf"), 0.0, m)  # a chunk of -inf alone: sum 0, no NaN
    s = tl.sum(tl.exp(x - safe), axis=0)
    out = part_ptr + (row * num_chunks + chunk) * 2
    tl.store(out, m)
    tl.store(out + 1, s)


@triton.jit
def _normalize_kernel(x_ptr, part_ptr, out_ptr, vocab, num_chunks, stride_row, stride_out,
                      CHUNK: tl.constexpr, PARTS_PAD: tl.constexpr,
                      USE_PDL: tl.constexpr = False):
    wait_for_inputs(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    parts = tl.arange(0, PARTS_PAD)
    inside = parts < num_chunks
    base = part_ptr + row * num_chunks * 2 + parts * 2
    m = tl.load(base, mask=inside, other=float("-inf"))
    s = tl.load(base + 1, mask=inside, other=0.0)
    top = tl.max(m, axis=0)
    safe = tl.where(top == float("-inf"), 0.0, top)
    scaled = tl.where(m == float("-inf"), 0.0, s * tl.exp(m - safe))
    lse = safe + tl.log(tl.sum(scaled, axis=0))
    token = chunk * CHUNK + tl.arange(0, CHUNK)
    keep = token < vocab
    x = tl.load(x_ptr + row * stride_row + token, mask=keep, other=0.0)
    tl.store(out_ptr + row * stride_out + token, x - lse, mask=keep)


def supports(vocab: int) -> bool:
    return vocab >= MIN_VOCAB


def log_softmax(x: Tensor) -> Tensor:
    """log_softmax over the last dim of float32 x (..., V) on a CUDA device (or the
    interpreter); static shapes, no host sync (CUDA graphs)."""
    assert x.dtype == torch.float32, x.dtype
    vocab = x.shape[-1]
    rows = x.reshape(-1, vocab)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    out = torch.empty((rows.shape[0], vocab), dtype=torch.float32, device=x.device)
    if rows.shape[0] == 0:
        return out.reshape(x.shape)
    num_chunks = triton.cdiv(vocab, CHUNK)
    parts = torch.empty((rows.shape[0], num_chunks, 2), dtype=torch.float32, device=x.device)
    pdl = use_pdl(x)
    grid = (rows.shape[0], num_chunks)
    _partials_kernel[grid](rows, parts, vocab, num_chunks, rows.stride(0), CHUNK=CHUNK,
                           USE_PDL=pdl, num_warps=4, **launch_kwargs(pdl))
    _normalize_kernel[grid](rows, parts, out, vocab, num_chunks, rows.stride(0), out.stride(0),
                            CHUNK=CHUNK, PARTS_PAD=triton.next_power_of_2(num_chunks),
                            USE_PDL=pdl, num_warps=4, **launch_kwargs(pdl))
    return out.reshape(x.shape)


def vocab_log_softmax(x: Tensor) -> Tensor:
    """The drafter's log-probabilities: these kernels on a CUDA device for a long
    vocabulary, torch.log_softmax elsewhere (x float32)."""
    if _enabled and x.device.type == "cuda" and supports(x.shape[-1]):
        return log_softmax(x)
    return torch.log_softmax(x, dim=-1)
