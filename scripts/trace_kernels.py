"""Kernels (and copies) of a round trace (ddtree/round_trace.py) by GPU time a round, with
their grids, between the trace's first and last round marks (a trace without them, as
engine_bench's profile8b writes: the whole trace, as one window). Under dependent
launches a kernel is resident (and timed) while the one before it runs, so a second
table charges each kernel only the time from the latest end before it to its own end
(what it added to the stream's critical path; idle gaps are charged to the kernel after
them), and gives the idle time:

    python3 scripts/trace_kernels.py engine-123.json [N]
"""

from __future__ import annotations

import collections
import json
import sys

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def main(argv: list[str]) -> int:
    path, top = argv[0], int(argv[1]) if len(argv) > 1 else 25
    with open(path) as f:
        trace = json.load(f)
    base = trace.get("baseTimeNanoseconds", 0) / 1000
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    marks = sorted(base + e["ts"] for e in events if e["name"] == "ddtree.round")
    if len(marks) >= 2:
        lo, hi, rounds = marks[0], marks[-1], len(marks) - 1
    else:
        lo, hi, rounds = float("-inf"), float("inf"), 1
    total: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.get("cat") in GPU_CATS and lo <= base + e["ts"] <= hi:
            key = f"{e['name'][:60]} {e.get('args', {}).get('grid', '')}"
            total[key] += e.get("dur", 0.0)
            calls[key] += 1
    print(f"{path}: {rounds} rounds, kernel time {sum(total.values()) / rounds:.1f} us a round "
          "(overlapping kernels counted each)")
    for key, value in total.most_common(top):
        print(f"{value / rounds:9.1f} us {calls[key] / rounds:6.2f}/round  {key}")
    charged: collections.Counter[str] = collections.Counter()
    idle, last_end = 0.0, None
    for e in sorted((e for e in events if e.get("cat") in GPU_CATS
                     and lo <= base + e["ts"] <= hi), key=lambda e: e["ts"]):
        end = e["ts"] + e.get("dur", 0.0)
        key = f"{e['name'][:60]} {e.get('args', {}).get('grid', '')}"
        if last_end is None:
            charged[key] += end - e["ts"]
        elif end > last_end:
            charged[key] += end - last_end
            idle += max(0.0, e["ts"] - last_end)
        last_end = end if last_end is None else max(last_end, end)
    print(f"critical path {sum(charged.values()) / rounds:.1f} us a round, of it idle "
          f"{idle / rounds:.1f} us (charged: end minus the latest end before)")
    for key, value in charged.most_common(top):
        print(f"{value / rounds:9.1f} us {calls[key] / rounds:6.2f}/round  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
