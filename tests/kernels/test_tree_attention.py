"""Tree attention kernel: a tree query equals its ar twin bitwise (same logical key values:
chain, star, random and single-node trees, ragged batches over several pool rows), whatever
the launch holds or max_kv_len says; and it matches the plain-PyTorch reference."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ddtree.kernels.tree_attention as attention_module
from ddtree.kernels.tree_attention import (
    ATTN_TILES,
    SPLIT_SIZE,
    WIDE_STAGES,
    launch_stages,
    split_loops_agree,
    stages_agree,
    tree_attention,
    tree_attention_reference,
    tree_attention_tiled,
)
from tests.kernels.tree_cases import Queries, TwinCase, chain, concat, random_tree, star, twin_case

ROOT = Path(__file__).resolve().parents[2]
SMALL_TILES = (16, 32)  # block, split: short contexts cross both boundaries (interpreter)

# (trees as (parents, committed length), Hq, Hkv, D, dtype, index dtype)
CASES = {
    "chain-crossing-a-split": ([(chain(5), 29)], 6, 2, 64, torch.bfloat16, torch.int64),
    "star-crossing-a-block": ([(star(5), 14)], 4, 1, 128, torch.float32, torch.int64),
    "random-ragged-rows": ([(random_tree(6, 3), 3), (random_tree(5, 4), 45), (chain(2), 70)],
                           8, 2, 128, torch.bfloat16, torch.int32),
    "single-nodes-at-split-edges": ([([-1], 31), ([-1], 32), ([-1], 0)], 2, 2, 64,
                                    torch.float32, torch.int64),
    "chain-fp16": ([(chain(4), 40)], 4, 2, 64, torch.float16, torch.int32),
}


def run(case: TwinCase, queries: Queries, max_kv_len: int | None = None,
        tiles: tuple[int, int] = SMALL_TILES) -> torch.Tensor:
    q = queries.q
    length = max_kv_len or int(queries.lengths().max())
    out = tree_attention_tiled(q, case.k_cache, case.v_cache, *queries.fields()[1:],
                               1 / math.sqrt(q.shape[-1]), length, *tiles)
    assert not out.isnan().any(), "a key outside the logical sequence was read"
    return out


def reference(case: TwinCase, queries: Queries) -> torch.Tensor:
    return tree_attention_reference(queries.q, case.k_cache, case.v_cache,
                                    *queries.fields()[1:], 1 / math.sqrt(queries.q.shape[-1]),
                                    compute_dtype=torch.float64)


def assert_close_to(out: torch.Tensor, ref: torch.Tensor) -> None:
    error = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    else:
        assert error < 1e-2, error


@pytest.fixture(params=list(CASES), scope="module")
def case(request: pytest.FixtureRequest) -> TwinCase:
    trees, num_heads, num_kv_heads, head_dim, dtype, index_dtype = CASES[request.param]
    return twin_case(trees, num_heads, num_kv_heads, head_dim, dtype, seed=1,
                     index_dtype=index_dtype)


@pytest.fixture(scope="module")
def outputs(case: TwinCase) -> tuple[torch.Tensor, torch.Tensor]:
    """The tree queries in one launch, their ar twins in another with a larger grid."""
    return run(case, case.tree), run(case, case.ar, int(case.ar.lengths().max()) + 40)


def test_tree_queries_equal_their_ar_twins_bitwise(
        outputs: tuple[torch.Tensor, torch.Tensor]) -> None:
    assert torch.equal(*outputs)


def test_output_does_not_depend_on_the_launch(
        case: TwinCase, outputs: tuple[torch.Tensor, torch.Tensor]) -> None:
    alone = outputs[0]
    mixed = concat([case.ar, case.tree])
    order = torch.randperm(mixed.q.shape[0], generator=torch.Generator().manual_seed(0))
    shuffled = run(case, mixed.select(order), max_kv_len=int(mixed.lengths().max()) + 70)
    restored = torch.empty_like(shuffled)
    restored[order] = shuffled
    num_tree = case.tree.q.shape[0]
    assert torch.equal(restored[num_tree:], alone) and torch.equal(restored[:num_tree], alone)
    last = case.tree.select(torch.tensor([num_tree - 1]))
    assert torch.equal(run(case, last)[0], alone[-1])


@pytest.mark.parametrize("split_programs", [1, 5])
def test_splits_taken_in_turn_by_fewer_programs_give_the_same_bits(
        case: TwinCase, outputs: tuple[torch.Tensor, torch.Tensor],
        split_programs: int) -> None:
    """A grid sized for a long model length (many splits a query) spreads each query's
    splits over at most `split_programs` programs in all; every split is computed as it
    would be by a program of its own."""
    queries = case.tree
    length = int(queries.lengths().max()) + 200  # ~8 more (empty) splits of 32 keys
    spread = tree_attention_tiled(queries.q, case.k_cache, case.v_cache,
                                  *queries.fields()[1:], 1 / math.sqrt(queries.q.shape[-1]),
                                  length, *SMALL_TILES, split_programs=split_programs)
    assert torch.equal(spread, outputs[0])


def test_matches_the_reference(case: TwinCase,
                               outputs: tuple[torch.Tensor, torch.Tensor]) -> None:
    assert_close_to(outputs[0], reference(case, case.tree))
    assert_close_to(outputs[1], reference(case, case.ar))


@pytest.mark.parametrize("dtype, head_dim, trees", [
    (torch.float32, 64, [(chain(3), 510), ([-1], 1)]),  # lengths 511..513, one of 1
    (torch.bfloat16, 128, [(star(3), 1023)]),  # lengths 1024, 1025: a third split of one key
])
def test_production_tiles_cross_a_split(dtype: torch.dtype, head_dim: int,
                                        trees: list[tuple[list[int], int]]) -> None:
    case = twin_case(trees, 4, 1, head_dim, dtype, seed=2)
    length = int(case.tree.lengths().max())
    tree_out = tree_attention(case.tree.q, case.k_cache, case.v_cache, *case.tree.fields()[1:],
                              0.1, length)
    ar_out = tree_attention(case.ar.q, case.k_cache, case.v_cache, *case.ar.fields()[1:],
                            0.1, length + 600)
    assert torch.equal(tree_out, ar_out)
    expected = tree_attention_reference(case.tree.q, case.k_cache, case.v_cache,
                                        *case.tree.fields()[1:], 0.1, torch.float64)
    assert_close_to(tree_out, expected)


def test_tree_keys_without_columns_read_the_prefix_only() -> None:
    case = twin_case([(chain(3), 20)], 2, 1, 64, torch.float32)
    no_columns = Queries(*case.ar.fields()[:4], case.ar.tree_keys[:, :0], case.ar.num_tree_keys)
    assert torch.equal(run(case, no_columns), run(case, case.ar))


def test_a_query_without_keys_gets_zeros() -> None:
    case = twin_case([([-1], 5)], 2, 1, 64, torch.float32)
    empty = Queries(case.ar.q, case.ar.query_slot, case.ar.prefix_len * 0, case.ar.tree_base,
                    case.ar.tree_keys, case.ar.num_tree_keys)
    assert torch.equal(run(case, empty, max_kv_len=8), torch.zeros_like(case.ar.q))


def test_rejects_malformed_arguments() -> None:
    case = twin_case([([-1], 5)], 2, 1, 64, torch.float32)
    meta = case.ar.fields()[1:]
    with pytest.raises(AssertionError, match="contiguous"):
        run(case, Queries(torch.randn(1, 2, 128)[..., :64], *meta))
    with pytest.raises(AssertionError, match="k_cache"):
        tree_attention(case.ar.q.bfloat16(), case.k_cache, case.v_cache, *meta, 0.1, 8)
    with pytest.raises(AssertionError, match="prefix_len"):
        tree_attention(case.ar.q, case.k_cache, case.v_cache, meta[0], meta[1][:0], *meta[2:],
                       0.1, 8)



LOOP = """$L__BB0_{n}:
\tld.global.b32 \t%r1, [%rd1];
\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{%f1}}, {{%r1}}, {{%r2}}, {{%f2}};
\t{op} \t%f3, %f1, %f2;
\tadd.s32 \t%r3, %r3, 64;
\t@%p1 bra \t$L__BB0_{n};  // backward: closes the loop
"""


def test_split_loops_agree_compares_the_float_ops_of_each_loop() -> None:
    """The loop check reads each backward branch's span and compares the float
    operations of the loops that have any (integer index arithmetic may differ, and so
    may the order of independent operations); a label with a comment is read as PTX
    writes it."""
    same = LOOP.format(n=1, op="max.f32") + LOOP.format(n=2, op="max.f32")
    other_int = same.replace("add.s32 \t%r3, %r3, 64;", "sub.s32 \t%r3, %r3, 1;", 1)
    assert split_loops_agree(same) and split_loops_agree(other_int)
    assert not split_loops_agree(LOOP.format(n=1, op="max.f32") + LOOP.format(n=2, op="min.f32"))
    extra = LOOP.format(n=1, op="max.f32") + LOOP.format(n=2, op="max.f32").replace(
        "\tmma.sync", "\tex2.approx.f32 \t%f9, %f9;\n\tmma.sync")
    assert not split_loops_agree(extra)
    reordered = LOOP.format(n=1, op="max.f32") + LOOP.format(n=2, op="max.f32").replace(
        "\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1}, {%r1}, {%r2}, {%f2};"
        "\n\tmax.f32 \t%f3, %f1, %f2;",
        "\tmax.f32 \t%f3, %f1, %f2;"
        "\n\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1}, {%r1}, {%r2}, {%f2};")
    assert reordered != same and split_loops_agree(reordered)
    prefetch = "$L__BB0_7:\n\tprefetch.global.L2 \t[%rd4];\n\t@%p2 bra \t$L__BB0_7;\n"
    assert split_loops_agree(prefetch + same)  # a loop without float ops is not compared
    labelled = same.replace("$L__BB0_2:", "$L__BB0_2:  // %.lr.ph")
    assert split_loops_agree(labelled)
    assert not split_loops_agree(labelled.replace("max.f32", "min.f32", 1))


def test_the_production_tiles_compile_to_agreeing_loops(
        sm90_reports: dict[str, list[dict]]) -> None:
    """Compiled for sm_90 on this machine (no GPU): under the production tiles of both
    head dims the split kernel's prefix loop and tree-key loop run the same float
    operations in the same order (the kernel also refuses, at its first launch on a GPU,
    a compiled variant where they do not)."""
    report = sm90_reports["loops"]
    production = [row for row in report if tuple(row["tiles"]) == ATTN_TILES[row["head_dim"]]]
    assert {row["head_dim"] for row in production} == {64, 128}, report
    assert all(row["agree"] for row in production), report


DEVICE = os.environ.get("DDTREE_TEST_DEVICE", "cpu")  # cuda: the GPU's compiled kernels


@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim, dtype", [
    (4, 1, 64, torch.bfloat16),  # 4 heads a KV head: groups of 4 queries
    (6, 2, 64, torch.float32),  # the demo's 3: groups of 5 (15 of the 16 rows)
    (4, 1, 128, torch.bfloat16),
])
def test_query_groups_give_the_ungrouped_bits(num_heads: int, num_kv_heads: int,
                                              head_dim: int, dtype: torch.dtype) -> None:
    """Trees whose nodes share 2-3 whole splits of prefix (split 32): those splits are
    computed once per group of consecutive nodes, side by side in one dot; every node's
    output is the ungrouped launch's, its ar twin's (each twin its own pool row: never
    grouped) and close to the reference. The second row starts inside a group (a group of
    two rows is not grouped) and a chain ends on a split boundary."""
    case = twin_case([(random_tree(9, 8), 70), (chain(5), 64), (random_tree(7, 9), 66)],
                     num_heads, num_kv_heads, head_dim, dtype, seed=7, device=DEVICE)
    queries = case.tree
    length = int(queries.lengths().max())

    def launch(query_group: int | None, batch: Queries) -> torch.Tensor:
        return tree_attention_tiled(batch.q, case.k_cache, case.v_cache, *batch.fields()[1:],
                                    1 / math.sqrt(head_dim), length, *SMALL_TILES,
                                    query_group=query_group)

    grouped = launch(None, queries)
    assert torch.equal(grouped, launch(1, queries))
    assert torch.equal(grouped, launch(None, case.ar))
    assert_close_to(grouped, reference(case, queries))


def test_a_wide_launch_equals_its_ar_twins_launched_alone() -> None:
    """The production launch (`tree_attention`): a tree of 17 nodes over 8 KV heads (136
    query-KV-head pairs: past an H200's 132 SMs, so on a GPU at head dim 128 the split
    kernel runs WIDE_STAGES) against each ar twin launched alone (8 pairs: the ATTN_TILES
    stages), bitwise; the tree's first split is shared (query groups: each group of 4
    nodes does it once), nodes at depth 3-5 cross a key block and a split (keys 510-514).
    DDTREE_TEST_DEVICE=cuda runs it on the GPU (the interpreter has no stages)."""
    case = twin_case([(random_tree(17, 5), 509)], 16, 8, 128, torch.bfloat16, seed=6,
                     device=DEVICE)
    length = int(case.ar.lengths().max())
    tree_out = tree_attention(case.tree.q, case.k_cache, case.v_cache,
                              *case.tree.fields()[1:], 0.1, length)
    for i in range(case.ar.q.shape[0]):
        twin = case.ar.select(torch.tensor([i], device=case.ar.q.device))
        alone = tree_attention(twin.q, case.k_cache, case.v_cache, *twin.fields()[1:], 0.1,
                               length)
        assert torch.equal(alone[0], tree_out[i]), f"node {i}"


@pytest.fixture(scope="module")
def sm90_reports() -> dict[str, list[dict]]:
    """The split kernel compiled for sm_90 here (no GPU, one subprocess): whether its key
    loops agree per tiling, and whether its wide-launch stages agree per dtype."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-m", "tests.kernels.compile_sm90", "--attention"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_wide_launch_stages_compile_to_the_same_float_operations(
        sm90_reports: dict[str, list[dict]]) -> None:
    """Compiled for sm_90 here (no GPU): the split kernel at a wide launch's stage count
    (WIDE_STAGES) runs the float operations of the head dim's ATTN_TILES stages, in the same
    order, in bf16 and float32, so a tree of many queries (a wide launch) keeps its ar
    twins' bits; and the key loops of the kernels with query groups (trees) do what those
    of the kernel without them (decoding) do. The kernel checks both at its first launch
    on a GPU."""
    report = sm90_reports["stages"]
    assert {(row["head_dim"], row["dtype"]) for row in report} == {
        (head_dim, dtype) for head_dim in WIDE_STAGES for dtype in ("bfloat16", "float32")}
    assert all(row["agree"] for row in report), report
    assert all(row["groups_agree"] for row in report), report  # with and without groups
    for row in report:  # fewer stages: less shared memory a program, so more programs an SM
        assert row["shared"][1] < row["shared"][0], row


def test_stages_agree_compares_the_whole_kernel_in_order() -> None:
    body = "\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1}, {%r1}, {%r2}, {%f2};\n"
    body += "\tmax.f32 %f3, %f4, %f5;\n\tex2.approx.f32 %f6, %f7;\n\tadd.f32 %f8, %f9, %f6;\n"
    loads = "\tcp.async.cg.shared.global [%r5], [%rd4], 16;\n"
    assert stages_agree(loads + body, body + loads + loads)  # loads are not float ops
    swapped = body.replace("max.f32", "TMP").replace("add.f32", "max.f32").replace("TMP", "add.f32")
    assert not stages_agree(body, swapped)  # same multiset, other order
    assert not stages_agree(body, body + "\tfma.rn.f32 %f1, %f2, %f3, %f4;\n")


def test_launch_stages_widen_only_past_the_device_s_sms(monkeypatch: pytest.MonkeyPatch) -> None:
    """From shapes alone: the head dim's WIDE_STAGES once the (query, KV head) pairs
    outnumber the SMs, the given stages below, on CPU tensors and head dims without an
    entry, and when switched off."""
    monkeypatch.setattr(attention_module, "_num_sms", lambda index: 132)
    cuda = torch.device("cuda", 0)
    assert launch_stages(128, 1, 8, 3, cuda) == 3  # one ar query of the 8B target
    assert launch_stages(128, 16, 8, 3, cuda) == 3  # a drafter block: 128 pairs
    assert launch_stages(128, 17, 8, 3, cuda) == WIDE_STAGES[128]
    assert launch_stages(128, 64, 8, 3, cuda) == WIDE_STAGES[128]  # a tree of 64 nodes
    assert launch_stages(64, 500, 3, 2, cuda) == 2  # no entry: the demo's head dim
    assert launch_stages(128, 64, 8, 3, torch.device("cpu")) == 3
    previous = attention_module.set_wide_stages(False)
    try:
        assert launch_stages(128, 64, 8, 3, cuda) == 3
    finally:
        attention_module.set_wide_stages(previous)


def test_a_backend_may_take_another_tiling() -> None:
    """ops.attention passes a Backend's `attn_tiles` to the kernel (the experiments' way to
    give the target and the drafter different tilings); None keeps the constants."""
    from ddtree.models.meta import AttentionMeta
    from ddtree.models.ops import Backend, attention

    case = twin_case([(random_tree(5, 2), 40)], 4, 2, 64, torch.float32, seed=4)
    queries = case.tree
    length = int(queries.lengths().max())
    meta = AttentionMeta(queries.query_slot, queries.query_slot, queries.query_slot,
                         queries.query_slot, queries.prefix_len, queries.tree_base,
                         queries.tree_keys, queries.num_tree_keys, length)
    small = attention(Backend(kernels=True, attn_tiles=(16, 4, 3)), queries.q, case.k_cache,
                      case.v_cache, meta, 0.125)
    assert torch.equal(small, tree_attention_tiled(queries.q, case.k_cache, case.v_cache,
                                                   *queries.fields()[1:], 0.125, length, 16,
                                                   SPLIT_SIZE))
    default = attention(Backend(kernels=True), queries.q, case.k_cache, case.v_cache, meta,
                        0.125)
    assert torch.equal(default, tree_attention(queries.q, case.k_cache, case.v_cache,
                                               *queries.fields()[1:], 0.125, length))
