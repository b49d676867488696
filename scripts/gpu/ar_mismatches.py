"""Which samples of `ddtree bench --json-out` reports differ from the ar row's outputs of
the same prompts (T = 0): prompt, repeat, mode, where they first differ, lengths. A sample
is compared by its token ids where it and the reference both carry them (in-process
reports), else by its text (reports through the gateway carry the text only). The ar rows
of every report given are the reference (the first output of each prompt), so the ar run
may be its own report:

    python3 scripts/gpu/ar_mismatches.py report.json [ar_report.json ...]

Prints one line per differing sample, then "D samples differ from ar (C of N compared)";
exits 1 when a report has no ar reference for a sample (nothing compared is not a pass).
"""

from __future__ import annotations

import gzip
import json
import sys
from typing import Any


def _load(path: str) -> dict[str, Any]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def main(paths: list[str]) -> int:
    reports = [_load(path) for path in paths]
    reference: dict[int, dict[str, Any]] = {}
    for report in reports:
        for row in report["rows"]:
            if row["mode"] == "ar":
                for sample in row["samples"]:
                    if sample.get("error"):
                        continue
                    reference.setdefault(sample["prompt_index"], sample)
    found = compared = total = 0
    for row in reports[0]["rows"]:
        for sample in row["samples"]:
            total += 1
            ref = reference.get(sample["prompt_index"])
            if ref is None:
                continue
            key = "token_ids" if (sample.get("token_ids") is not None
                                  and ref.get("token_ids") is not None) else "text"
            got, want = sample.get(key), ref.get(key)
            if got is None or want is None:
                continue
            compared += 1
            if got == want:
                continue
            first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                         min(len(got), len(want)))
            found += 1
            info = {k: v for k, v in sample.items() if k not in ("token_ids", "text", "itl_s")}
            print(f"{row['mode']} c{row['concurrency']} prompt {sample['prompt_index']} "
                  f"repeat {sample.get('repeat')}: first {key} diff at {first}, {len(got)} vs "
                  f"{len(want)}; got {got[first:first + 4]!r} want {want[first:first + 4]!r}; "
                  f"{info}")
    print(f"{found} samples differ from ar ({compared} of {total} compared)")
    return 0 if compared == total else 1


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
