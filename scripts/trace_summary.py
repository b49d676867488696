"""Summarises a torch.profiler Chrome trace of engine rounds (scripts/profile_remote_drafter.py
--trace-dir, engine_bench.py profile8b): per `engine.step` range, its wall time, the time
the GPU was busy (the union of kernels and copies), each labelled range inside it, and
the GPU's idle gaps longest first with the CPU ops running on the traced thread meanwhile;
then kernels by total time (with their grids, which tell GEMM shapes apart).

    python3 scripts/trace_summary.py TRACE.json [--steps 3] [--kernels 25]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def load(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:  # type: ignore[operator]
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def busy(intervals: list[tuple[float, float]]) -> tuple[float, list[tuple[float, float]]]:
    """The union's length and its idle gaps (start, end) between first and last."""
    total, gaps, end = 0.0, [], None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            if end is not None:
                gaps.append((end, start))
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total, gaps


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("trace", type=Path)
    parser.add_argument("--steps", type=int, default=3, help="steps shown in detail")
    parser.add_argument("--kernels", type=int, default=25)
    parser.add_argument("--step-name", default="engine.step")
    parser.add_argument("--split-label", default="admit",
                        help="totals apart for the steps where this range lasts > 0.1 ms")
    args = parser.parse_args(argv)
    events = load(args.trace)
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    cpu = [e for e in events if e.get("cat") == "cpu_op"]
    labels = [e for e in events if e.get("cat") == "user_annotation"]
    steps = sorted((e for e in labels if e["name"] == args.step_name), key=lambda e: e["ts"])
    print(f"{args.trace.name}: {len(steps)} steps, {len(gpu)} GPU events")
    walls, busys = [], []
    split = defaultdict(lambda: [0, 0.0, 0.0])  # with / without the label: steps, wall, busy
    for index, step in enumerate(steps):
        start, stop = step["ts"], step["ts"] + step["dur"]
        inside = [(max(e["ts"], start), min(e["ts"] + e["dur"], stop)) for e in gpu
                  if e["ts"] < stop and e["ts"] + e["dur"] > start]
        total, gaps = busy(inside)
        walls.append(step["dur"])
        busys.append(total)
        marked = any(e["name"] == args.split_label and e["dur"] > 100 and start <= e["ts"] < stop
                     for e in labels)
        for value, i in ((1, 0), (step["dur"], 1), (total, 2)):
            split[marked][i] += value
        if index >= args.steps:
            continue
        print(f"-- step {index}: wall {step['dur'] / 1e3:.3f} ms, GPU busy {total / 1e3:.3f} ms "
              f"({len(inside)} GPU events)")
        for label in sorted((e for e in labels if start <= e["ts"] < stop
                             and e is not step), key=lambda e: e["ts"]):
            print(f"   {label['name']:<14} at {(label['ts'] - start) / 1e3:7.3f} ms "
                  f"for {label['dur'] / 1e3:.3f} ms")
        for gap_start, gap_stop in sorted(gaps, key=lambda g: g[0] - g[1])[:6]:
            ops = sorted((e for e in cpu if e["ts"] < gap_stop and e["ts"] + e["dur"] > gap_start
                          and e["dur"] > 20), key=lambda e: -e["dur"])[:4]
            shown = ", ".join(f"{e['name']} {e['dur']:.0f}us" for e in ops)
            print(f"   GPU idle {(gap_stop - gap_start) / 1e3:.3f} ms at "
                  f"{(gap_start - start) / 1e3:.3f}: {shown}")
    if steps:
        print(f"all steps: wall {sum(walls) / 1e3:.1f} ms, GPU busy {sum(busys) / 1e3:.1f} ms "
              f"({sum(busys) / max(sum(walls), 1e-9):.1%})")
        for marked, (count, wall, gpu_busy) in sorted(split.items()):
            print(f"  {count} steps {'with' if marked else 'without'} {args.split_label}: "
                  f"wall {wall / 1e3:.1f} ms, GPU busy {gpu_busy / 1e3:.1f} ms "
                  f"({gpu_busy / max(wall, 1e-9):.1%}), {wall / count / 1e3:.3f} ms a step")
        walls.sort()
        busys.sort()
        print(f"median step {walls[len(walls) // 2] / 1e3:.3f} ms, GPU busy "
              f"{busys[len(busys) // 2] / 1e3:.3f} ms")
    by_kernel: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in gpu:
        grid = e.get("args", {}).get("grid")
        by_kernel[(e["name"][:60], str(grid))].append(e["dur"])
    print(f"{'kernel':<62}{'grid':<18}{'calls':>7}{'total us':>10}{'mean us':>9}")
    for (name, grid), durs in sorted(by_kernel.items(), key=lambda kv: -sum(kv[1]))[:args.kernels]:
        print(f"{name:<62}{grid:<18}{len(durs):>7}{sum(durs):>10.0f}{sum(durs) / len(durs):>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
