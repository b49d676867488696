"""The draft half's inputs in two kernels, where PyTorch took ~30 small launches.

Before the drafter's first GEMM a round used to gather each row's state columns (seven
index kernels and a cast), its pending target features (an index kernel), then build the
new context rows' and the blocks' attention descriptions (aranges, adds, compares,
`where`, four `contiguous` copies, a `full`, three concatenations), the blocks' inputs
(an embedding lookup and a concatenation): ~30 kernels of 1-3 us, none of which can
overlap its neighbours as the Triton kernels do (programmatic dependent launch:
ddtree/kernels/launch.py), a few per cent of a drafter block at the 8B shapes (lease
37's profile of the draft graph). Here:

- `gather_rows`: each row's state columns (B,) and pending features (B, b, W) at its
  pool slot, one program per (row, block position, feature chunk) - the engine's
  in-process draft half;
- `block_inputs`: for B rows of blocks of b: where the new context rows go (row b's j-th
  at position committed - pending + j of its slot, rows past its pending count in the
  scratch slot), where the blocks go (committed + j), the blocks' committed prefix and
  their embeddings (the bonus token's row of the embedding table, then the mask row b - 1
  times), one program per (row, block position) - every drafting path.

Everything here is integer arithmetic and copies: the same integers and bits as the
PyTorch builders (`ddtree.models.meta.context_meta`, `block_meta`, `stored_rows`,
`DFlashDrafter.block_embeddings`; tests/kernels/test_draft_prologue.py).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from ddtree.kernels.launch import launch_kwargs, use_pdl, wait_for_inputs

W_BLOCK = 1024  # feature / hidden columns a program copies at a time


@triton.jit
def _gather_rows_kernel(rows_ptr, ints_ptr, columns_ptr, table_ptr, pending_ptr, out_ptr,
                        stride_ints, stride_slot, stride_pos, batch, width,
                        BLOCK: tl.constexpr, NUM_COLUMNS: tl.constexpr,
                        C_PAD: tl.constexpr, W_BLOCK: tl.constexpr,
                        USE_PDL: tl.constexpr = False):
    wait_for_inputs(USE_PDL)
    r = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1).to(tl.int64)
    chunk = tl.program_id(2)
    slot = tl.load(rows_ptr + r)
    if (j == 0) & (chunk == 0):  # the row's state columns, once
        c = tl.arange(0, C_PAD)
        real = c < NUM_COLUMNS
        column = tl.load(columns_ptr + c, mask=real, other=0)
        tl.store(table_ptr + c * batch + r,
                 tl.load(ints_ptr + slot * stride_ints + column, mask=real, other=0), mask=real)
    w = chunk * W_BLOCK + tl.arange(0, W_BLOCK)
    inside = w < width
    values = tl.load(pending_ptr + slot * stride_slot + j * stride_pos + w, mask=inside)
    tl.store(out_ptr + (r * BLOCK + j) * width + w, values, mask=inside)


@functools.cache  # never evicted: captured graphs read these tensors
def _columns(columns: tuple[int, ...], device: torch.device) -> Tensor:
    """The column indices on the device (built eagerly: graphs warm up before they
    capture)."""
    return torch.tensor(columns, dtype=torch.int64, device=device)


def gather_rows(rows: Tensor, ints: Tensor, columns: tuple[int, ...],
                pending: Tensor) -> tuple[Tensor, Tensor]:
    """rows: (B,) int64 pool slots; ints: (S, C) int64 state table; pending: (S, b, W)
    per-slot features. -> (ints[rows][:, columns].T (len(columns), B) int64 contiguous,
    pending[rows] (B, b, W))."""
    batch = rows.shape[0]
    _, block, width = pending.shape
    assert ints.dtype == torch.int64 and ints.stride(1) == 1, (ints.dtype, ints.stride())
    assert pending.stride(2) == 1, pending.stride()
    table = torch.empty(len(columns), batch, dtype=torch.int64, device=rows.device)
    out = torch.empty(batch, block, width, dtype=pending.dtype, device=pending.device)
    if batch == 0:
        return table, out
    pdl = use_pdl(ints)
    _gather_rows_kernel[(batch, block, triton.cdiv(width, W_BLOCK))](
        rows.contiguous(), ints, _columns(columns, rows.device), table, pending, out,
        ints.stride(0), pending.stride(0), pending.stride(1), batch, width, BLOCK=block,
        NUM_COLUMNS=len(columns), C_PAD=triton.next_power_of_2(len(columns)),
        W_BLOCK=W_BLOCK, USE_PDL=pdl, num_warps=4, **launch_kwargs(pdl))
    return table, out


@triton.jit
def _block_inputs_kernel(slots_ptr, committed_ptr, num_pending_ptr, bonus_ptr, embed_ptr,
                         mask_ptr, positions_ptr, write_slot_ptr, prefix_ptr, x_ptr,
                         stride_embed, scratch, num_tokens, hidden, BLOCK: tl.constexpr,
                         W_BLOCK: tl.constexpr, USE_PDL: tl.constexpr = False):
    wait_for_inputs(USE_PDL)
    r = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1).to(tl.int64)
    slot = tl.load(slots_ptr + r)
    committed = tl.load(committed_ptr + r)
    num_pending = tl.load(num_pending_ptr + r)
    t = r * BLOCK + j
    # The new context row j (stored first), then the block's position j.
    tl.store(positions_ptr + t, committed - num_pending + j)
    tl.store(write_slot_ptr + t, tl.where(j < num_pending, slot, scratch))
    tl.store(positions_ptr + num_tokens + t, committed + j)
    tl.store(write_slot_ptr + num_tokens + t, slot)
    tl.store(prefix_ptr + t, committed)
    # The block's input row: the bonus token's embedding first, then the mask row.
    bonus = tl.load(bonus_ptr + r)
    for start in range(0, hidden, W_BLOCK):
        h = start + tl.arange(0, W_BLOCK)
        inside = h < hidden
        if j == 0:
            values = tl.load(embed_ptr + bonus * stride_embed + h, mask=inside)
        else:
            values = tl.load(mask_ptr + h, mask=inside)
        tl.store(x_ptr + t * hidden + h, values, mask=inside)


def block_inputs(slots: Tensor, committed: Tensor, num_pending: Tensor, bonus: Tensor,
                 block_size: int, scratch: int, embed_weight: Tensor,
                 mask_row: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """slots, committed, num_pending, bonus: (B,) int64; embed_weight: (V, H); mask_row:
    (H,) of its dtype. With T = B * block_size -> positions (2T,) and write slots (2T,)
    (the T new context rows, then the T block rows: `stored_rows(context_meta(slots,
    committed - num_pending, b, num_pending, scratch), block_meta(...))`'s), each block
    row's committed prefix (T,) and the blocks' embeddings x (T, H)."""
    batch = slots.shape[0]
    num_tokens = batch * block_size
    hidden = embed_weight.shape[1]
    device = slots.device
    assert embed_weight.stride(1) == 1 and mask_row.is_contiguous()
    assert mask_row.dtype == embed_weight.dtype, (mask_row.dtype, embed_weight.dtype)
    positions = torch.empty(2 * num_tokens, dtype=torch.int64, device=device)
    write_slot = torch.empty(2 * num_tokens, dtype=torch.int64, device=device)
    prefix = torch.empty(num_tokens, dtype=torch.int64, device=device)
    x = torch.empty(num_tokens, hidden, dtype=embed_weight.dtype, device=device)
    if batch == 0:
        return positions, write_slot, prefix, x
    pdl = use_pdl(embed_weight)
    _block_inputs_kernel[(batch, block_size)](
        slots.contiguous(), committed.contiguous(), num_pending.contiguous(),
        bonus.contiguous(), embed_weight, mask_row, positions, write_slot, prefix, x,
        embed_weight.stride(0), scratch, num_tokens, hidden, BLOCK=block_size,
        W_BLOCK=min(W_BLOCK, triton.next_power_of_2(hidden)), USE_PDL=pdl, num_warps=4,
        **launch_kwargs(pdl))
    return positions, write_slot, prefix, x
