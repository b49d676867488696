"""Tree attention's split kernel under other (BLOCK_N, num_warps, num_stages) settings, per
head dim, on the GPU: each candidate's tree queries checked bitwise against their ar twins
(480 queries of chains and random trees whose depths cross a key block or a split, bf16;
the invariance the engine's exactness rests on), then timed in CUDA-graph replay (as the
engine replays it, dependent launches on) at the shapes the engine runs: decode (1 query),
a batch-1 tree and a batch of trees, for the demo target's heads (9 / 3 x 64) and
Qwen3-8B's (32 / 8 x 128). The settings are per head dim (`ATTN_TILES`,
ddtree/kernels/tree_attention.py). The twin check is necessary, not sufficient: a new
setting also needs the exact stage end to end (engine_bench.py --stages exact, whose
--target-attn-tiles / --drafter-attn-tiles take one).

    python3 scripts/gpu/attn_sweep.py [--json-out FILE]
    python3 scripts/gpu/attn_sweep.py --twins 64/4/3 64/2/2   # the twin checks only
    python3 scripts/gpu/attn_sweep.py --groups   # committed tiles: one query a program
                                                 # against query groups, both stage counts

Prints one table per head dim (us per call), the committed setting first, the best by the
sum over that head dim's shapes last.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

import torch

from ddtree.kernels.tree_attention import (
    ATTN_TILES,
    SPLIT_SIZE,
    WIDE_STAGES,
    tree_attention_tiled,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests.kernels helpers
from tests.kernels.bench_tree_attention import tree_batch  # noqa: E402
from tests.kernels.timing import graph_replay_us, num_copies, rotating  # noqa: E402
from tests.kernels.tree_cases import chain, random_tree, twin_case  # noqa: E402

# name -> (Hq, Hkv, D, shapes as (requests, committed keys, tree nodes))
HEADS = {
    "smollm2": (9, 3, 64, ((1, 400, 1), (1, 400, 17), (8, 400, 17), (8, 400, 33))),
    "qwen3": (32, 8, 128, ((1, 512, 1), (1, 512, 64), (8, 512, 64), (1, 4096, 1))),
}
CANDIDATES = list(itertools.product((32, 64, 128), (2, 4, 8), (2, 3, 4)))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU (TRITON_INTERPRET=1):
#   the twin checks of two candidates, no timing (a smoke run of the script)


# (tree, committed keys): trees whose nodes cross a key block (64) or a split (256) at
# their depth, so that an ar query reaches in the prefix loop a block its tree twin reaches
# in the tree-key loop (lease 15's single case, a tree after 300 keys, never did)
TWIN_TREES = ([(chain(16), n) for n in (50, 56, 60, 63, 64, 120, 127, 244, 250, 255, 300,
                                         310, 500, 505)]
              + [(random_tree(16, seed), n) for seed, n in enumerate(
                  (57, 58, 59, 60, 61, 62, 63, 64, 250, 251, 252, 253, 254, 255, 256, 315))])


def twin_failures(num_heads: int, num_kv_heads: int, head_dim: int,
                  tiles: tuple[int, int, int],
                  ar_tiles: tuple[int, int, int] | None = None) -> list[tuple[int, int]]:
    """(committed keys, node) of every tree query of TWIN_TREES whose output is not its ar
    twin's bits under these settings (empty: the invariance the engine's exactness rests
    on held). `ar_tiles`: the twins' own settings where they differ (a wide launch's stage
    count against a narrow one's, tree_attention.WIDE_STAGES)."""
    case = twin_case(TWIN_TREES, num_heads, num_kv_heads, head_dim, torch.bfloat16, seed=3,
                     device=DEVICE)
    scale = 1 / math.sqrt(head_dim)

    def run(queries, max_kv_len: int, tiles: tuple[int, int, int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
        block, warps, stages = tiles
        return tree_attention_tiled(queries.q, case.k_cache, case.v_cache,
                                    *queries.fields()[1:], scale, max_kv_len, block,
                                    SPLIT_SIZE, True, warps, stages)

    max_kv_len = int(case.ar.lengths().max())
    same = (run(case.tree, max_kv_len, tiles) == run(case.ar, max_kv_len, ar_tiles or tiles)
            ).flatten(1).all(1).cpu()
    owners = [(n, node) for parents, n in TWIN_TREES for node in range(len(parents))]
    return [owner for owner, ok in zip(owners, same.tolist(), strict=True) if not ok]


def twins_equal(num_heads: int, num_kv_heads: int, head_dim: int,
                tiles: tuple[int, int, int]) -> bool:
    return not twin_failures(num_heads, num_kv_heads, head_dim, tiles)


def timer(num_heads: int, num_kv_heads: int, head_dim: int,
          shape: tuple[int, int, int]):  # type: ignore[no-untyped-def]
    """tiles -> us per call at `shape` (inputs rotated through more than the L2)."""
    batch, context, nodes = shape
    meta = tree_batch(batch, nodes, context, torch.device("cuda"))
    length = context + nodes
    kv_bytes = 2 * batch * length * num_kv_heads * head_dim * 2
    pools = [torch.randn(2, batch, length, num_kv_heads, head_dim, device="cuda").bfloat16()
             for _ in range(num_copies(kv_bytes, torch.device("cuda")))]
    q = torch.randn(batch * nodes, num_heads, head_dim, device="cuda").bfloat16()
    index = [meta[key] for key in ("query_slot", "prefix_len", "tree_base", "tree_keys",
                                   "num_tree_keys")]
    scale = 1 / math.sqrt(head_dim)
    max_kv_len = 2048 if length <= 2048 else 8192  # a graph's grid: the engine's bound

    def time_tiles(tiles: tuple[int, int, int], query_group: int | None = None) -> float:
        block, warps, stages = tiles
        return graph_replay_us(rotating([
            lambda p=p: tree_attention_tiled(q, p[0], p[1], *index, scale, max_kv_len, block,
                                             SPLIT_SIZE, True, warps, stages,
                                             query_group=query_group)
            for p in pools]))

    return time_tiles


def groups_table(json_out: Path | None) -> int:
    """us per call at every shape of HEADS: the committed tiles one query a program and in
    query groups, each at the tile's stages and (head dims with an entry) WIDE_STAGES; the
    twin check of the grouped launch first (grouped tree queries against ar twins)."""
    results: dict[str, list[dict]] = {}
    failed = 0
    for name, (num_heads, num_kv_heads, head_dim, shapes) in HEADS.items():
        tiles = ATTN_TILES[head_dim]
        stage_counts = sorted({tiles[2], WIDE_STAGES.get(head_dim, tiles[2])}, reverse=True)
        timers = [timer(num_heads, num_kv_heads, head_dim, shape) for shape in shapes]
        bad = twin_failures(num_heads, num_kv_heads, head_dim, tiles)
        failed += bool(bad)
        print(f"== {name}: grouped twins differing: {len(bad)}", flush=True)
        rows = []
        for stages in stage_counts:
            for group in (1, None):
                setting = (tiles[0], tiles[1], stages)
                us = [round(time_tiles(setting, group), 2) for time_tiles in timers]
                rows.append({"stages": stages, "groups": group is None, "us": us})
                print(json.dumps({"heads": name, **rows[-1]}), flush=True)
        results[name] = rows
        print(f"{'stages / groups':>18}  " + "  ".join(f"{str(s):>16}" for s in shapes))
        for row in rows:
            label = f"{row['stages']} / {'groups' if row['groups'] else 'one query'}"
            print(f"{label:>18}  " + "  ".join(f"{u:16.2f}" for u in row["us"]), flush=True)
    if json_out:
        json_out.write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--twins", nargs="*", default=None,
                        metavar="BLOCK/WARPS/STAGES[:BLOCK/WARPS/STAGES]",
                        help="only the twin checks of these settings at both head dims "
                             "(every failing (committed keys, node)), no timing; after a "
                             "colon the ar twins' own settings")
    parser.add_argument("--groups", action="store_true",
                        help="only the production tiles at each shape: one query a program "
                             "against query groups, at the tile's stages and at WIDE_STAGES")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {}
    if args.groups:
        return groups_table(args.json_out)
    if args.twins is not None or DEVICE == "cpu":
        def parse(text: str) -> tuple[int, int, int]:
            block, warps, stages = (int(v) for v in text.split("/"))
            return block, warps, stages

        settings = [(parse(text.split(":")[0]), parse(text.split(":")[-1]))
                    for text in args.twins or ()]
        failed = 0
        for name, (num_heads, num_kv_heads, head_dim, _) in HEADS.items():
            if DEVICE == "cpu":  # the interpreter: small heads, two settings
                num_heads, num_kv_heads = 4, 2
            for tiles, ar_tiles in settings or [(ATTN_TILES[head_dim],) * 2, ((32, 2, 2),) * 2]:
                bad = twin_failures(num_heads, num_kv_heads, head_dim, tiles, ar_tiles)
                failed += bool(bad)
                label = "/".join(map(str, tiles)) + (
                    "" if ar_tiles == tiles else ":" + "/".join(map(str, ar_tiles)))
                print(f"{name} {label}: {len(bad)} of "
                      f"{sum(len(p) for p, _ in TWIN_TREES)} tree queries differ from their "
                      f"ar twins; committed keys of those: {sorted({n for n, _ in bad})}",
                      flush=True)
        return 1 if failed else 0
    for name, (num_heads, num_kv_heads, head_dim, shapes) in HEADS.items():
        committed = ATTN_TILES[head_dim]
        timers = [timer(num_heads, num_kv_heads, head_dim, shape) for shape in shapes]
        rows = []
        for tiles in [committed] + [c for c in CANDIDATES if c != committed]:
            row: dict = {"tiles": list(tiles)}
            try:
                row["twins_equal"] = twins_equal(num_heads, num_kv_heads, head_dim, tiles)
                row["us"] = [round(time_tiles(tiles), 2) for time_tiles in timers]
            except Exception as error:  # noqa: BLE001 - e.g. out of shared memory
                row["error"] = f"{type(error).__name__}: {str(error)[:120]}"
            rows.append(row)
            print(json.dumps({"heads": name, **row}), flush=True)
        results[name] = rows
        good = [r for r in rows if r.get("twins_equal") and "us" in r]
        print(f"== {name}: shapes (requests, keys, nodes) {list(shapes)}")
        print(f"{'block/warps/stages':>20}  " + "  ".join(f"{str(s):>16}" for s in shapes)
              + "       sum  twins")
        for r in sorted(good, key=lambda r: sum(r["us"]))[:8] + [rows[0]]:
            print(f"{'/'.join(map(str, r['tiles'])):>20}  "
                  + "  ".join(f"{u:16.2f}" for u in r.get("us", []))
                  + f"  {sum(r.get('us', [math.nan])):8.2f}  {r.get('twins_equal')}")
        bad = [r["tiles"] for r in rows if r.get("twins_equal") is False]
        print(f"   twins differ: {bad}; errors: {sum('error' in r for r in rows)}", flush=True)
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
