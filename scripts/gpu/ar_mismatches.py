"""Which samples of a `ddtree bench --json-out` report differ from the ar row's outputs of
the same prompts (T = 0): prompt, repeat, mode, where the token ids first differ, lengths.

    python3 scripts/gpu/ar_mismatches.py report.json
"""

from __future__ import annotations

import json
import sys


def main(path: str) -> int:
    report = json.loads(open(path).read())
    rows = report["rows"]
    reference: dict[int, list[int]] = {}
    for row in rows:
        if row["mode"] == "ar":
            for sample in row["samples"]:
                if sample.get("token_ids") is not None:
                    reference.setdefault(sample["prompt_index"], sample["token_ids"])
    found = 0
    for row in rows:
        for sample in row["samples"]:
            ids, ref = sample.get("token_ids"), reference.get(sample["prompt_index"])
            if ids is None or ref is None or ids == ref:
                continue
            first = next((i for i, (a, b) in enumerate(zip(ids, ref, strict=False)) if a != b),
                         min(len(ids), len(ref)))
            found += 1
            info = {k: v for k, v in sample.items() if k not in ("token_ids", "text", "itl_s")}
            print(f"{row['mode']} c{row['concurrency']} prompt {sample['prompt_index']} "
                  f"repeat {sample.get('repeat')}: first diff at {first}, {len(ids)} vs "
                  f"{len(ref)} tokens; got {ids[first:first + 4]} want {ref[first:first + 4]}; "
                  f"{info}")
    print(f"{found} samples differ from ar")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
