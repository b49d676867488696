"""Summarise py-spy's raw (collapsed) stacks, as lease call 83 records them
(`py-spy record --threads --format raw`, gzipped or not): each thread's share of the
samples and its top frames, self and inclusive.

    python scripts/gpu/spy_summary.py \
        docs/gpu-runs/2026-12-03-lease20/call83-idle/spy_c8_verifier.txt.gz

With `--idle` recordings a waiting thread is sampled too (its wait is its leaf frame);
with `--gil` only the thread holding the GIL is, so the sample count over the recording's
seconds x rate is the share of time the process held its GIL.
"""

from __future__ import annotations

import argparse
import collections
import gzip
from collections.abc import Iterator
from pathlib import Path


def stacks(path: Path) -> Iterator[tuple[list[str], int]]:
    """(frames, outermost first: the thread's label, then the calls; sample count)."""
    with (gzip.open(path, "rt") if path.suffix == ".gz" else path.open()) as lines:
        for line in lines:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if stack:
                yield stack.split(";"), int(count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--top", type=int, default=15, help="frames listed per thread")
    parser.add_argument("--threads", type=int, default=6, help="threads listed")
    args = parser.parse_args()
    per_thread: collections.Counter[str] = collections.Counter()
    own: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    within: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for frames, count in stacks(args.path):
        thread, calls = frames[0], frames[1:]
        per_thread[thread] += count
        if calls:
            own[thread][calls[-1]] += count
        for frame in set(calls):
            within[thread][frame] += count
    total = sum(per_thread.values())
    print(f"{args.path}: {total} samples")
    for thread, count in per_thread.most_common(args.threads):
        print(f"== {thread}: {count} samples ({100 * count / total:.1f}%)")
        for title, table in (("self", own[thread]), ("inclusive", within[thread])):
            print(f"  -- {title}")
            for frame, n in table.most_common(args.top):
                print(f"  {100 * n / count:5.1f}% {frame[:150]}")


if __name__ == "__main__":
    main()
