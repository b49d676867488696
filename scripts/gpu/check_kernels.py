#!/usr/bin/env python3
"""Checks and times ddtree's Triton kernels on the GPU, in one run from the repo root:
`python3 scripts/gpu/check_kernels.py` (about a minute on an H200). `--quick` runs tiny
shapes; without a GPU it runs them under TRITON_INTERPRET=1, to check the script itself.

Per kernel: (a) accuracy against its plain-PyTorch reference on fresh random data, the
caching allocator's next block filled with NaN first (NaN never passes); (b) bitwise
invariance: linear rows across T and offsets, tree queries equal to their ar twins, launch
independence, CUDA-graph replay with new metadata, a pool past 2^31 elements; (c) timings
against the torch alternative (do_bench median and CUDA-graph replay, tests/kernels/bench_*);
(d) compact tables and the check summary last, every number in $OUT/kernels.json when OUT
is set.
Exits 1 when any check fails."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import triton  # noqa: E402

from ddtree.kernels import matmul  # noqa: E402
from ddtree.kernels.rmsnorm import rms_norm, rms_norm_reference  # noqa: E402
from ddtree.kernels.rope import rope_store, rope_store_reference  # noqa: E402
from ddtree.kernels.swiglu import silu_mul, silu_mul_reference  # noqa: E402
from ddtree.kernels.tree_attention import (  # noqa: E402
    ATTN_TILES,
    BLOCK_N,
    PREFIX_LOOP,
    SPLIT_SIZE,
    tree_attention,
    tree_attention_reference,
    tree_attention_tiled,
)
from ddtree.kernels.vocab_topk import topk_logsumexp  # noqa: E402
from ddtree.tree import _stable_topk  # noqa: E402
from tests.kernels import (  # noqa: E402
    bench_matmul,
    bench_rmsnorm,
    bench_rope,
    bench_swiglu,
    bench_tree_attention,
    bench_vocab_topk,
)
from tests.kernels.tree_cases import (  # noqa: E402
    Queries,
    TwinCase,
    chain,
    concat,
    random_tree,
    star,
    twin_case,
)

TINY_LINEARS = {"tiny.qkv": (96, 64), "tiny.lm_head": (160, 128)}
FP32_LINEARS = ("smollm2.qkv", "smollm2.down", "smollm2.lm_head", "tiny.qkv")
FULL_ROWS, QUICK_ROWS = (1, 2, 7, 16, 17, 64, 65, 128, 520), (1, 2, 7, 17)
FULL_TREES = [(chain(16), 500), (star(16), 63), (random_tree(64, 7), 1000), ([-1], 511),
              ([-1], 512), (chain(8), 2040)]
QUICK_TREES = [(chain(2), 510), (star(3), 5), ([-1], 512)]
TUNING_DEADLINE_S = 60  # the sweeps start only before this, to keep the run near 90 s


class Report:
    def __init__(self) -> None:
        self.checks: list[dict] = []
        self.timings: list[dict] = []
        self.tuning: list[dict] = []
        self.errors: list[str] = []
        self.configs: dict[str, str] = {}

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.checks.append({"name": name, "ok": bool(ok), "detail": detail})
        print(f"{'PASS' if ok else 'FAIL'} {name} {detail}", flush=True)

    def section(self, name: str, fn: Callable[[], object], counts: bool = True) -> None:
        start = time.perf_counter()
        try:
            fn()
        except Exception:  # one broken kernel must not hide the others' results
            if counts:
                self.check(f"{name}: ran", False, traceback.format_exc(limit=4))
            else:  # a timing that breaks is reported, but it is not a wrong result
                self.errors.append(f"{name}: {traceback.format_exc(limit=4)}")
                print(f"ERROR {self.errors[-1]}", flush=True)
        print(f"-- {name}: {time.perf_counter() - start:.1f} s", flush=True)

    @property
    def failures(self) -> list[dict]:
        return [check for check in self.checks if not check["ok"]]


def poison(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    """Free a NaN-filled block of the output's size: the caching allocator hands it to the
    kernel's output next, so an element the kernel fails to write reads NaN."""
    if device.type == "cuda":
        del_me = torch.full(shape, float("nan"), dtype=dtype, device=device)
        del del_me


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return math.inf
    return ((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def check_close(report: Report, name: str, out: torch.Tensor, ref: torch.Tensor,
                tolerance: float) -> None:
    error = relative_error(out, ref)
    report.check(f"{name} accuracy", error < tolerance, f"rel err {error:.2e} < {tolerance:g}")


def check_equal(report: Report, name: str, out: torch.Tensor, expected: torch.Tensor) -> None:
    same = out.shape == expected.shape and torch.equal(out, expected)
    detail = "" if same or out.shape != expected.shape else (
        f"{(out != expected).sum().item()} elements differ, max "
        f"{(out.double() - expected.double()).abs().max().item():.3g}")
    report.check(f"{name} bitwise", same, detail)


def tolerance_of(dtype: torch.dtype, device: torch.device | None = None) -> float:
    if dtype == torch.float32:
        return 1e-5
    return 3e-2 if device is not None and device.type == "cpu" else 1e-2  # truncating casts


def check_rounding(report: Report, name: str, out: torch.Tensor, ref: torch.Tensor) -> None:
    """The kernel repeats eager's rounding steps, so on the GPU nearly every element is
    bitwise eager's; only reduction order and libm ulps may move a few."""
    if out.device.type == "cuda" and out.dtype != torch.float32:
        fraction = (out == ref).double().mean().item()
        report.check(f"{name} rounds like eager", fraction >= 0.95,
                     f"{fraction:.4f} of elements bitwise equal (>= 0.95)")


def exact_rounding(dtype: torch.dtype, device: torch.device) -> bool:
    """The interpreter truncates float32 -> bf16 casts; the GPU rounds to nearest even."""
    return dtype != torch.bfloat16 or device.type == "cuda"


# ---------------------------------------------------------------------------------------
# (a) + (b): correctness and invariance


def check_linear(report: Report, device: torch.device, quick: bool) -> None:
    shapes = TINY_LINEARS if quick else {**bench_matmul.SMOLLM2_LINEARS,
                                         **bench_matmul.QWEN3_LINEARS}
    row_counts = QUICK_ROWS if quick else FULL_ROWS
    for name, (out_features, in_features) in shapes.items():
        dtypes = [torch.bfloat16] + ([torch.float32] if name in FP32_LINEARS else [])
        for dtype in dtypes:
            config = matmul.linear_config(out_features, in_features, dtype)
            report.configs[f"{name}.{dtype}"] = str(config)
            _check_one_linear(report, f"linear {name} {str(dtype)[6:]}", out_features,
                              in_features, dtype, bench_matmul.out_dtype_of(name), row_counts,
                              device, with_bias=name.endswith("qkv"))


def _check_one_linear(report: Report, name: str, out_features: int, in_features: int,
                      dtype: torch.dtype, out_dtype: torch.dtype | None,
                      row_counts: tuple[int, ...], device: torch.device,
                      with_bias: bool) -> None:
    weight = (torch.randn(out_features, in_features, device=device) / in_features**0.5).to(dtype)
    bias = torch.randn(out_features, device=device).to(dtype) if with_bias else None
    x = torch.randn(max(row_counts) + 40, in_features, device=device).to(dtype)
    poison((x.shape[0], out_features), out_dtype or dtype, device)
    whole = matmul.invariant_linear(x, weight, bias, out_dtype)
    expected = matmul.linear_reference(x[:65], weight, bias, torch.float64)
    tolerance = tolerance_of(out_dtype or dtype)
    if dtype != torch.float32 and out_dtype == torch.float32:
        tolerance = 5e-5  # exact bf16 products, but tensor-core sums of unstated precision
    check_close(report, name, whole[:65], expected, tolerance)
    variants = _num_compiled(matmul._linear_kernel)
    mismatches = []
    for num_rows in row_counts:
        for offset in (0, 37):
            part = matmul.invariant_linear(x[offset:offset + num_rows], weight, bias, out_dtype)
            if not torch.equal(part, whole[offset:offset + num_rows]):
                mismatches.append((num_rows, offset))
    report.check(f"{name} rows invariant over T={list(row_counts)}", not mismatches,
                 f"differ at (T, offset) {mismatches}" if mismatches else "")
    if variants is not None:  # do_not_specialize: no new binary for T = 1 or T % 16 == 0,
        # only for another row tile (matmul.ROW_TILES: other output tiles, the same bits)
        tiles = {matmul.linear_config(out_features, in_features, dtype, rows)
                 for rows in row_counts} - {
            matmul.linear_config(out_features, in_features, dtype, x.shape[0])}
        added = _num_compiled(matmul._linear_kernel) - variants
        report.check(f"{name} one binary per row tile", added <= len(tiles),
                     f"{added} compiled for {len(tiles)} other row tiles")


def _num_compiled(kernel: object) -> int | None:
    caches = getattr(kernel, "device_caches", None)
    return None if caches is None else sum(len(cache[0]) for cache in caches.values())


def check_tree_attention(report: Report, device: torch.device, quick: bool) -> None:
    heads = {"tiny": (2, 1, 64)} if quick else bench_tree_attention.HEADS
    trees = QUICK_TREES if quick else FULL_TREES
    for name, (num_heads, num_kv_heads, head_dim) in heads.items():
        for dtype in (torch.bfloat16, torch.float32):
            case = twin_case(trees, num_heads, num_kv_heads, head_dim, dtype, seed=3,
                             index_dtype=torch.int32, device=device)
            label = f"tree_attention {name} {str(dtype)[6:]}"
            _check_twins(report, label, case, device)
            if dtype == torch.bfloat16 and name != "qwen3":  # the PREFIX_LOOP = False fallback
                _check_twins(report, f"{label} one loop", case, device, prefix_loop=False)
    if device.type == "cuda" and not quick:
        _check_large_pool(report, device)


def _attend(case: TwinCase, queries: Queries, max_kv_len: int | None = None,
            prefix_loop: bool = PREFIX_LOOP) -> torch.Tensor:
    """The production launch (the head dim's ATTN_TILES), with PREFIX_LOOP or without."""
    length = max_kv_len or int(queries.lengths().max())
    poison(tuple(queries.q.shape), queries.q.dtype, queries.q.device)
    block_n, warps, stages = ATTN_TILES.get(queries.q.shape[-1], (BLOCK_N, 4, 3))
    return tree_attention_tiled(queries.q, case.k_cache, case.v_cache, *queries.fields()[1:],
                                1 / math.sqrt(queries.q.shape[-1]), length, block_n,
                                SPLIT_SIZE, prefix_loop, warps, stages)


def _check_twins(report: Report, name: str, case: TwinCase, device: torch.device,
                 prefix_loop: bool = PREFIX_LOOP) -> None:
    tree_out = _attend(case, case.tree, None, prefix_loop)
    ar_out = _attend(case, case.ar, int(case.ar.lengths().max()) + 300, prefix_loop)
    check_equal(report, f"{name} tree == ar twin", tree_out, ar_out)
    mixed = concat([case.ar, case.tree])
    order = torch.randperm(mixed.q.shape[0], device=device)
    shuffled = _attend(case, mixed.select(order), int(mixed.lengths().max()) + 1000,
                       prefix_loop)
    restored = torch.empty_like(shuffled)
    restored[order] = shuffled
    check_equal(report, f"{name} shuffled mixed launch", restored,
                torch.cat([tree_out, tree_out]))
    last = case.tree.select(torch.tensor([case.tree.q.shape[0] - 1], device=device))
    check_equal(report, f"{name} one query alone", _attend(case, last, None, prefix_loop)[0],
                tree_out[-1])
    scale = 1 / math.sqrt(case.tree.q.shape[-1])
    for label, queries, out in (("tree", case.tree, tree_out), ("ar", case.ar, ar_out)):
        expected = tree_attention_reference(queries.q, case.k_cache, case.v_cache,
                                            *queries.fields()[1:], scale, torch.float64)
        check_close(report, f"{name} {label}", out, expected, tolerance_of(out.dtype))
    if device.type == "cuda" and prefix_loop == PREFIX_LOOP:
        _check_graph_replay(report, name, case, tree_out)


def _check_graph_replay(report: Report, name: str, case: TwinCase,
                        tree_out: torch.Tensor) -> None:
    """Capture the tree launch, then replay it on the ar twins' metadata copied into the
    same buffers: the grid was sized by max_kv_len alone, so the outputs must not move."""
    static = [field.clone() for field in case.tree.fields()]
    length = int(max(case.tree.lengths().max(), case.ar.lengths().max()))

    def launch() -> torch.Tensor:  # production tiles, as `_attend`'s tree_out
        return tree_attention(static[0], case.k_cache, case.v_cache, *static[1:],
                              1 / math.sqrt(static[0].shape[-1]), length)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = launch()
    for buffer, field in zip(static[1:], case.ar.fields()[1:], strict=True):
        buffer[..., :field.shape[-1]].copy_(field)
    graph.replay()
    torch.cuda.synchronize()
    check_equal(report, f"{name} graph replayed on ar metadata", out, tree_out)


def _check_large_pool(report: Report, device: torch.device, rows: int = 130,
                      max_len: int = 16640) -> None:
    """A layer view of more than 2^31 elements (130 x 16640 x 8 x 128): the far row must be
    addressed in int64. Three queries with equal logical keys: ar in the far row, ar in row
    0, tree keys in the far row."""
    num_kv_heads, head_dim = 8, 128
    k_cache = torch.empty(1, rows, max_len, num_kv_heads, head_dim, device=device,
                          dtype=torch.bfloat16)[0]
    v_cache = torch.empty_like(k_cache)
    for cache in (k_cache, v_cache):
        values = torch.randn(1000, num_kv_heads, head_dim, device=device).bfloat16()
        cache[0, :1000], cache[rows - 1, :1000] = values, values
    q = torch.randn(1, 32, head_dim, device=device).bfloat16().expand(3, -1, -1).contiguous()
    meta = [torch.tensor(values, device=device, dtype=torch.int32) for values in
            ([rows - 1, 0, rows - 1], [1000, 1000, 990], [0, 0, 990], [0, 0, 0])]
    tree_keys = torch.arange(10, device=device, dtype=torch.int32).expand(3, -1).contiguous()
    args = (q, k_cache, v_cache, meta[0], meta[1], meta[2], tree_keys, meta[3])
    meta[3][2] = 10
    out = tree_attention(*args, 0.088, 1000)
    expected = tree_attention_reference(*args, 0.088, torch.float64)
    check_close(report, "tree_attention pool of 2^31+ elements", out, expected, 1e-2)
    check_equal(report, "tree_attention far row == row 0 == tree keys", out[0:1].expand(3, -1, -1),
                out)


def check_rms_norm(report: Report, device: torch.device, quick: bool) -> None:
    for hidden in (64, 100) if quick else (576, 4096):
        for dtype in (torch.bfloat16, torch.float32):
            name = f"rms_norm H={hidden} {str(dtype)[6:]}"
            x = (3 * torch.randn(65 if quick else 520, hidden, device=device)).to(dtype)
            residual = torch.randn_like(x)
            weight = (1 + torch.randn(hidden, device=device) / 5).to(dtype)
            poison(tuple(x.shape), dtype, device)
            normed, h = rms_norm(x, weight, 1e-6, residual)
            expected, expected_h = rms_norm_reference(x, weight, 1e-6, residual)
            if exact_rounding(dtype, device):
                check_equal(report, f"{name} residual sum == eager", h, expected_h)
            check_close(report, name, normed, expected, tolerance_of(dtype, device))
            check_rounding(report, name, normed, expected)
            alone = [rms_norm(x[i:i + 1], weight, 1e-6, residual[i:i + 1])[0] for i in (0, 64)]
            check_equal(report, f"{name} row alone", torch.cat(alone), normed[[0, 64]])


def check_rope(report: Report, device: torch.device, quick: bool) -> None:
    heads = {"tiny": (4, 2, 64, True)} if quick else bench_rope.HEADS
    rows = 9 if quick else 65
    for name, (num_heads, num_kv_heads, head_dim, with_norm) in heads.items():
        for dtype in (torch.bfloat16, torch.float32):
            label = f"rope_store {name} {str(dtype)[6:]}"
            args = bench_rope.rope_inputs(device, rows, num_heads, num_kv_heads, head_dim,
                                          with_norm, dtype)
            if with_norm:
                args["q_norm_weight"] = (1 + torch.randn(head_dim, device=device) / 5).to(dtype)
                args["k_norm_weight"] = (1 + torch.randn(head_dim, device=device) / 5).to(dtype)
            args["positions"] = torch.randint(0, 30000, (rows,), device=device)
            pool = torch.full((2, *args["k_cache"].shape), float("nan"), device=device,
                              dtype=dtype)
            theirs = {**args, "k_cache": pool[0].clone(), "v_cache": pool[1].clone()}
            mine = {**args, "k_cache": pool[0], "v_cache": pool[1]}
            poison((rows, num_heads, head_dim), dtype, device)
            q = rope_store(**mine)
            expected = rope_store_reference(**theirs)
            check_close(report, f"{label} q", q, expected, tolerance_of(dtype, device))
            check_rounding(report, f"{label} q", q, expected)
            written = theirs["k_cache"].isnan().logical_not()
            check_equal(report, f"{label} only the written slots", mine["k_cache"].isnan(),
                        ~written)
            check_close(report, f"{label} k", mine["k_cache"][written],
                        theirs["k_cache"][written], tolerance_of(dtype, device))
            check_equal(report, f"{label} v copied", mine["v_cache"].nan_to_num(),
                        theirs["v_cache"].nan_to_num())
            one = {**mine, **{key: args[key][rows - 2:rows - 1] for key in
                              ("qkv", "positions", "write_slot", "write_pos")}}
            check_equal(report, f"{label} row alone", rope_store(**one), q[rows - 2:rows - 1])


def check_silu_mul(report: Report, device: torch.device, quick: bool) -> None:
    for inner in (100, 256) if quick else (1536, 12288):
        for dtype in (torch.bfloat16, torch.float32):
            name = f"silu_mul I={inner} {str(dtype)[6:]}"
            num_rows = 65 if quick else 520
            gate_up = (2 * torch.randn(num_rows, 2 * inner, device=device)).to(dtype)
            poison((num_rows, inner), dtype, device)
            out = silu_mul(gate_up)
            expected = silu_mul_reference(gate_up)
            check_close(report, name, out, expected, tolerance_of(dtype, device))
            check_rounding(report, name, out, expected)
            check_equal(report, f"{name} row alone", silu_mul(gate_up[5:6]), out[5:6])


def check_vocab_topk(report: Report, device: torch.device, quick: bool) -> None:
    """The drafter's vocabulary top-K over the logits: the tokens and order of
    `_stable_topk` (ties to the lower id: integer logits tie by the thousand), one row
    alone as in the batch; the log-sum-exp from the same passes against torch's."""
    for vocab in (700,) if quick else (49152, 151936):
        for k in (16,) if quick else (16, 64):
            name = f"vocab_topk V={vocab} K={k}"
            logits = 4 * torch.randn(*((4, 1) if quick else (8, 15)), vocab, device=device)
            for label, values in (("random", logits), ("ties", logits.round().clamp(-2, 2))):
                for bitonic in (True, False):
                    case = f"{name} {label}{'' if bitonic else ' rounds'}"
                    got, lse = topk_logsumexp(values, k, bitonic)
                    check_equal(report, f"{case} == torch", got, _stable_topk(values, k))
                    check_equal(report, f"{case} row alone",
                                topk_logsumexp(values[3:4], k, bitonic)[0], got[3:4])
                    check_close(report, f"{case} logsumexp", lse,
                                torch.logsumexp(values, dim=-1), 1e-5)


# ---------------------------------------------------------------------------------------
# (c) timings and (d) the table


def run_benchmarks(report: Report, device: torch.device, quick: bool,
                   only: set[str] | frozenset[str] = frozenset()) -> None:
    if quick:
        benches = {
            "linear": lambda: bench_matmul.bench_linear(device, TINY_LINEARS, (1, 16)),
            "tree_attention": lambda: bench_tree_attention.bench_tree_attention(
                device, {"tiny": (4, 2, 64)}, (1,), (64,), (1, 4)),
            "rms_norm": lambda: bench_rmsnorm.bench_rms_norm(device, {"tiny": 64}, (1,)),
            "rope_store": lambda: bench_rope.bench_rope_store(device, {"tiny": (4, 2, 64, True)},
                                                              (1,)),
            "silu_mul": lambda: bench_swiglu.bench_silu_mul(device, {"tiny": 64}, (1,)),
            "vocab_topk": lambda: bench_vocab_topk.bench_vocab_topk(
                device, {"tiny": 700}, (1,), (16,), (("", None),))}
    else:
        shapes = {**bench_matmul.SMOLLM2_LINEARS, **bench_matmul.QWEN3_LINEARS}
        benches = {
            "linear": lambda: bench_matmul.bench_linear(device, shapes),
            "tree_attention": lambda: bench_tree_attention.bench_tree_attention(device),
            "rms_norm": lambda: bench_rmsnorm.bench_rms_norm(device),
            "rope_store": lambda: bench_rope.bench_rope_store(device),
            "silu_mul": lambda: bench_swiglu.bench_silu_mul(device),
            "vocab_topk": lambda: bench_vocab_topk.bench_vocab_topk(device)}
    for name, bench in benches.items():
        if only and name not in only:
            continue
        report.section(f"timing {name}", lambda bench=bench: report.timings.extend(bench()),
                       counts=False)


def run_tuning(report: Report, device: torch.device, quick: bool, started: float) -> None:
    """Tilings, split-K counts and attention tiles other than the planned ones, while time
    is left."""
    if quick:
        sweeps = {"linear tilings": lambda: bench_matmul.bench_linear_tilings(
                      device, {"tiny.qkv": TINY_LINEARS["tiny.qkv"]}, (1,)),
                  "attention tiles": lambda: bench_tree_attention.bench_tiles(
                      device, ((64, 512, True), (32, 64, False)), ((1, 64, 1),),
                      ("tiny", (4, 2, 64)))}
    else:
        qwen = {name: bench_matmul.QWEN3_LINEARS[name] for name in ("qwen3.qkv", "qwen3.o",
                                                                     "qwen3.down")}
        sweeps = {"linear tilings": lambda: bench_matmul.bench_linear_tilings(device, qwen),
                  "attention tiles": lambda: bench_tree_attention.bench_tiles(device)}
    for name, sweep in sweeps.items():
        if time.perf_counter() - started > TUNING_DEADLINE_S:
            print(f"-- tuning {name}: skipped, past {TUNING_DEADLINE_S} s", flush=True)
            continue
        report.section(f"tuning {name}", lambda sweep=sweep: report.tuning.extend(sweep()),
                       counts=False)


def print_table(rows: list[dict], title: str) -> None:
    """One line per (kernel, case): `T: ours/torch/floor` in us, CUDA-graph replay times
    (do_bench's and everything else are in the JSON)."""
    print(f"\n{title} -- T: ours/torch/floor us (graph replay)")
    lines: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        lines.setdefault((row["kernel"], row["case"]), []).append(
            f"{row['T']}: {row['ours_graph_us']:.1f}/{row['torch_graph_us']:.1f}/"
            f"{row['floor_us']:.1f}")
    for (kernel, case), cells in lines.items():
        print(f"{kernel:<20} {case:<21} " + "  ".join(cells))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes (CPU: interpreter)")
    parser.add_argument("--no-bench", action="store_true", help="checks only, no timings")
    parser.add_argument("--only", default="", help="these kernels' checks and timings only "
                        "(comma list: linear, tree_attention, rms_norm, rope_store, "
                        "silu_mul, vocab_topk; no tuning)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.quick:
        parser.error("no GPU here: run with --quick (Triton interpreter)")
    start = time.perf_counter()
    torch.manual_seed(0)
    report = Report()
    only = set(filter(None, args.only.split(",")))
    for name, check in (("linear", check_linear), ("tree_attention", check_tree_attention),
                        ("rms_norm", check_rms_norm), ("rope_store", check_rope),
                        ("silu_mul", check_silu_mul), ("vocab_topk", check_vocab_topk)):
        if not only or name in only:
            report.section(name, lambda check=check: check(report, device, args.quick))
    if not args.no_bench:
        run_benchmarks(report, device, args.quick, only)
        if not only:
            run_tuning(report, device, args.quick, start)
    print_table(report.tuning, "tuning (torch: the same torch call as in the timings)")
    print_table(report.timings, "timings")
    wall = time.perf_counter() - start
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu (interpreter)"
    summary = {"device": device_name, "torch": torch.__version__, "triton": triton.__version__,
               "quick": args.quick, "wall_s": wall, "linear_configs": report.configs,
               "checks": report.checks, "timings": report.timings, "tuning": report.tuning,
               "timing_errors": report.errors}
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "kernels.json").write_text(json.dumps(summary, indent=1))
    failures = report.failures
    print(f"\n{device_name}, torch {torch.__version__}, triton {triton.__version__}: "
          f"{len(report.checks) - len(failures)}/{len(report.checks)} checks passed in "
          f"{wall:.0f} s")
    for error in report.errors:
        print(f"TIMING ERROR (not a check) {error[-400:]}")
    for failure in failures:
        print(f"FAILED {failure['name']}: {failure['detail'][-600:]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
