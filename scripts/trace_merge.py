"""Lines up the GPU timelines of processes traced at once (ddtree/round_trace.py:
DDTREE_TRACE_ROUNDS / DDTREE_TRACE_DIR, e.g. the verifier and the drafter service under
`ddtree serve`) and says where the GPU's time went over the window all traces cover:
each process's busy time, and the idle gaps between consecutive GPU work, by which
process ran before and which after (a gap between two processes' work includes the
GPU's switch between their contexts). Per round: the first trace's round marks.

    python3 scripts/trace_merge.py engine-123.json drafter-456.json [--gaps 10]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
MARK = "ddtree.round"


def load(path: Path) -> tuple[list[tuple[float, float, str]], list[float], tuple[float, float]]:
    """GPU intervals (start, end, name) and round marks, in microseconds of the host's clock,
    and the trace's own span."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:  # type: ignore[operator]
        trace = json.load(f)
    base = trace.get("baseTimeNanoseconds", 0) / 1000.0
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    gpu = [(base + e["ts"], base + e["ts"] + e.get("dur", 0.0), e["name"]) for e in events
           if e.get("cat") in GPU_CATS]
    marks = sorted(base + e["ts"] for e in events if e.get("name") == MARK)
    stamps = [base + e["ts"] for e in events]
    return gpu, marks, (min(stamps), max(stamps))


def union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("traces", type=Path, nargs="+")
    parser.add_argument("--gaps", type=int, default=10, help="longest gaps listed")
    args = parser.parse_args(argv)
    loaded = [load(path) for path in args.traces]
    names = [path.stem for path in args.traces]
    lo = max(span[0] for _, _, span in loaded)
    hi = min(span[1] for _, _, span in loaded)
    if hi <= lo:
        print("the traces do not overlap in time")
        return 1
    marks = [m for m in loaded[0][1] if lo <= m <= hi]
    if len(marks) >= 2:  # whole rounds of the first trace
        lo, hi = marks[0], marks[-1]
    rounds = max(len(marks) - 1, 1)
    window = hi - lo
    print(f"window {window / 1000:.2f} ms, {rounds} rounds of {names[0]} "
          f"({window / rounds / 1000:.3f} ms a round)")
    work: list[tuple[float, float, int, str]] = []
    for index, (gpu, _, _) in enumerate(loaded):
        clipped = [(max(s, lo), min(e, hi), index, n) for s, e, n in gpu if e > lo and s < hi]
        busy = union([(s, e) for s, e, _, _ in clipped])
        print(f"  {names[index]:<24} GPU busy {busy / 1000:8.2f} ms "
              f"({busy / rounds:7.1f} us a round, {len(clipped) / rounds:6.1f} launches a round)")
        work.extend(clipped)
    work.sort()
    total = union([(s, e) for s, e, _, _ in work])
    print(f"  {'all':<24} GPU busy {total / 1000:8.2f} ms ({total / rounds:7.1f} us a round), "
          f"idle {(window - total) / rounds:7.1f} us a round")
    gaps: dict[tuple[int, int], list[float]] = defaultdict(list)
    listed: list[tuple[float, float, str, str]] = []
    end, owner, last_name = None, -1, ""
    for start, stop, index, name in work:
        if end is not None and start > end:
            gaps[(owner, index)].append(start - end)
            listed.append((start - end, end, last_name, name))
        if end is None or stop > end:
            end, owner, last_name = stop, index, name
    print("idle gaps (before -> after): count, us a round, mean us, max us")
    for (before, after), values in sorted(gaps.items()):
        print(f"  {names[before]:>24} -> {names[after]:<24} {len(values):6d} "
              f"{sum(values) / rounds:9.1f} {sum(values) / len(values):8.1f} {max(values):8.1f}")
    for length, at, before, after in sorted(listed, reverse=True)[: args.gaps]:
        print(f"  gap {length:8.1f} us at +{(at - lo) / 1000:8.3f} ms: "
              f"{before[:50]} -> {after[:50]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
