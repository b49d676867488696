# ruff: noqa: B023 (each case runs inside its own loop iteration)
"""The tree build kernel (`ddtree.kernels.tree_build.tree_from_ranks`) at the demo's
vocabulary and depth, per budget and batch: graph replay, us per call; with `--against
FILE` (another version of ddtree/kernels/tree_build.py) that version beside it on the same
inputs, with its trees compared bit for bit; with `--wide-beams` this version also at the
beam widths before the twenty-eighth session (min(N, K^d) at every depth: the same trees).
Run on the GPU machine:

    python3 scripts/gpu/tree_build_bench.py [--against old_tree_build.py] [--wide-beams]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys

import torch

sys.path.insert(0, ".")

from ddtree.kernels import tree_build  # noqa: E402
from ddtree.tree import _beam_widths  # noqa: E402
from tests.kernels.timing import graph_replay_us  # noqa: E402

VOCAB, DEPTH = 49152, 15


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--against", default="", help="another tree_build.py to compare")
    parser.add_argument("--warps", default="0",
                        help="this version's warps to time, e.g. 2,4,8 (0: warps_for)")
    parser.add_argument("--sort", action="store_true",
                        help="also each depth's beam by a full sort (before the top-W)")
    parser.add_argument("--wide-beams", action="store_true",
                        help="also at min(N, K^d) prefixes a depth (the former widths)")
    args = parser.parse_args()
    versions = {"this": tree_build}
    warps = [int(w) for w in args.warps.split(",")]
    if args.against:
        spec = importlib.util.spec_from_file_location("other_tree_build", args.against)
        assert spec is not None and spec.loader is not None
        other = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(other)
        versions["other"] = other
    torch.manual_seed(0)
    rows = []
    for num_nodes in (16, 32, 63, 127):
        for batch in (1, 8):
            logits = torch.randn(batch, DEPTH, VOCAB, device="cuda")
            lse = logits.logsumexp(-1)
            ranks = logits.topk(num_nodes, dim=-1).indices
            widths = _beam_widths(num_nodes, num_nodes, DEPTH)
            ones = torch.ones(batch, dtype=torch.long, device="cuda")
            budget = ones * num_nodes
            force = torch.arange(batch, device="cuda") % 2 == 0
            max_topk = torch.zeros(batch, dtype=torch.long, device="cuda")
            wide = tuple(min(num_nodes, num_nodes ** d) for d in range(1, DEPTH + 1))
            outs, times = {}, {}
            cases = [(f"this/{w}w", tree_build, w, widths) for w in warps]
            if args.sort:
                cases.append(("sort/4w", tree_build, -4, widths))
            if args.wide_beams:
                cases.append(("wide beams", tree_build, 4, wide))
            if "other" in versions:
                cases.append(("other", versions["other"], 4, widths))
            for name, module, num_warps, beams in cases:
                extra = ({"num_warps": abs(num_warps), "select_topk": num_warps >= 0}
                         if module is tree_build else {})

                def build(module=module, extra=extra, beams=beams):  # noqa: ANN202
                    return module.tree_from_ranks(logits, lse, ranks, ones, beams, num_nodes,
                                                  budget, force, max_topk, **extra)
                outs[name] = build()
                times[name] = round(graph_replay_us(build), 2)
            first = outs[cases[0][0]]
            same = all(torch.equal(a, b) for out in outs.values()
                       for a, b in zip(first, out, strict=True))
            rows.append({"nodes": num_nodes, "batch": batch, "same": same, **times})
            print(f"N={num_nodes:<4} B={batch}  " + "  ".join(
                f"{name} {us:7.2f} us" for name, us in times.items()) + f"  same {same}",
                flush=True)
    json.dump(rows, open("/tmp/tree_build_bench.json", "w"), indent=1)


if __name__ == "__main__":
    main()
