"""Where the drafter service's start-up warm-up spends its time, shape by shape.

Lease 13 measured `drafter_warmed_up` at 113-149 s for 56 (batch, node) shapes on a fresh
H200 host (72.5 s for the 8 shapes at batch 1), while the colocated verifier warmed the
same drafting graphs and its own (93 graphs) in 30-51 s. This builds the drafter service's
GraphDrafter exactly as `drafter_svc` does and times each shape of its warm-up, in the
warm-up's order, with cProfile over the first `--profile` shapes (Triton compiles show
under triton.compiler, captures under torch.cuda.graphs). Run it twice: against an empty
TRITON_CACHE_DIR and again with the cache it filled.

    TRITON_CACHE_DIR=/tmp/tc python3 scripts/gpu/warmup_timing.py --target T --drafter D
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time

import numpy as np
import torch

from ddtree.engine.draft_graphs import BUDGET, SLOTS, DraftInputs, GraphDrafter
from ddtree.engine.drafting import LocalDrafter
from drafter_svc.config import DrafterServiceConfig
from drafter_svc.server import load_models


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--profile", type=int, default=2, help="shapes under cProfile")
    parser.add_argument("--json-out", default="")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    config = DrafterServiceConfig(drafter=args.drafter, target=args.target,
                                  device=args.device, dtype=args.dtype)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    started = time.perf_counter()
    drafter, embeddings, info, max_model_len = load_models(config)
    local = LocalDrafter(drafter, embeddings, config.max_sessions, max_model_len)
    graphs = GraphDrafter(local, config.max_sessions, config.max_budget,
                          len(info.target_layer_ids) * info.hidden_size)
    print(f"load {time.perf_counter() - started:.1f} s; batches {graphs.batches}, "
          f"node buckets {graphs.node_buckets}", flush=True)
    rows = []
    for index, (batch, num_nodes) in enumerate(
            (b, n) for b in reversed(graphs.batches) for n in reversed(graphs.node_buckets)):
        ints = np.zeros((7, batch), dtype=np.int64)
        ints[SLOTS], ints[BUDGET] = graphs.scratch, num_nodes
        profile = cProfile.Profile() if index < args.profile else None
        sync()
        started = time.perf_counter()
        if profile is not None:
            profile.enable()
        graphs.propose(DraftInputs(ints, torch.zeros(0, graphs.feature_width)))
        sync()
        if profile is not None:
            profile.disable()
        seconds = time.perf_counter() - started
        again = time.perf_counter()
        graphs.propose(DraftInputs(ints, torch.zeros(0, graphs.feature_width)))  # replay
        sync()
        rows.append({"batch": batch, "num_nodes": num_nodes, "first_s": round(seconds, 3),
                     "replay_ms": round((time.perf_counter() - again) * 1e3, 2)})
        print(f"batch {batch:3d} nodes {num_nodes:4d}: first {seconds:7.3f} s, "
              f"replay {rows[-1]['replay_ms']:7.2f} ms", flush=True)
        if profile is not None:
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(18)
            print(out.getvalue()[-4000:], flush=True)
    total = sum(row["first_s"] for row in rows)
    print(f"{len(rows)} shapes, {total:.1f} s")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
