"""The draft half's input kernels (ddtree/kernels/draft_prologue.py) give the PyTorch
builders' integers and bits: the gathered state columns and pending features (padding
rows on the scratch slot included), and where the context rows and blocks go, their
attention description and the blocks' embeddings (`context_meta`, `block_meta`,
`stored_rows`, `block_embeddings`), for a mask embedding and for a mask token."""

from __future__ import annotations

import pytest
import torch

from ddtree.kernels import draft_prologue
from ddtree.models.meta import block_meta, context_meta, prologue_metas, stored_rows


def test_gather_rows_reads_each_rows_columns_and_pending_features() -> None:
    gen = torch.Generator().manual_seed(0)
    ints = torch.randint(-5, 100, (6, 11), generator=gen)  # 5 slots + scratch, 11 columns
    pending = torch.randn(6, 4, 1500, generator=gen).to(torch.bfloat16)  # W: two chunks
    rows = torch.tensor([3, 0, 5, 5])  # the last two: padding on the scratch slot
    columns = (2, 9, 0, 4, 7, 1)
    table, gathered = draft_prologue.gather_rows(rows, ints, columns, pending)
    assert table.shape == (6, 4) and table.is_contiguous()
    assert torch.equal(table, ints[rows][:, list(columns)].T)
    assert gathered.dtype == torch.bfloat16 and torch.equal(gathered, pending[rows])


@pytest.mark.parametrize("mask_token", [False, True])
def test_block_inputs_are_the_pytorch_builders(mask_token: bool) -> None:
    gen = torch.Generator().manual_seed(1)
    block, hidden, scratch, max_len = 4, 1100, 7, 64  # hidden: two chunks of a program
    embed = torch.randn(50, hidden, generator=gen).to(torch.bfloat16)
    mask_row = embed[13] if mask_token else torch.randn(hidden, generator=gen).to(
        torch.bfloat16)
    slots = torch.tensor([2, 0, scratch])
    committed = torch.tensor([11, 9, 0])
    num_pending = torch.tensor([3, 1, 0])
    bonus = torch.tensor([7, 8, 0])
    positions, write_slot, prefix, x = draft_prologue.block_inputs(
        slots, committed, num_pending, bonus, block, scratch, embed, mask_row)
    meta, stored = prologue_metas(positions, write_slot, prefix, block, max_len)

    want_block = block_meta(slots, committed, block, max_len)
    want_context = context_meta(slots, committed - num_pending, block, num_pending, scratch)
    want_stored = stored_rows(want_context, want_block)
    for name in ("positions", "write_slot", "write_pos"):
        assert torch.equal(getattr(stored, name), getattr(want_stored, name)), name
    for name in ("positions", "write_slot", "write_pos", "query_slot", "prefix_len",
                 "tree_base", "tree_keys", "num_tree_keys"):
        assert torch.equal(getattr(meta, name), getattr(want_block, name)), name
    assert (meta.max_kv_len, meta.queries_per_row) == (max_len, want_block.queries_per_row)

    first = embed[bonus]  # (B, H)
    want_x = torch.cat([first[:, None], mask_row.expand(3, block - 1, hidden)], dim=1)
    assert x.dtype == torch.bfloat16 and torch.equal(x, want_x.reshape(3 * block, hidden))
