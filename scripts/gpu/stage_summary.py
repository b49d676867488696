"""Where a bench row's time went, per request, from a report's samples: TTFT, the decode
phase a token, the server's device time a round (`stage_seconds.verify` over the rounds),
its prefill time a request, and how many distinct first-token times the requests had (a
closed loop of fixed-length requests in process runs in lockstep waves: few distinct
times, its prefills batched; through a server each request is usually admitted alone).

    python3 scripts/gpu/stage_summary.py report.json[.gz] ...
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
from pathlib import Path
from typing import Any


def load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:  # type: ignore[operator]
        report: dict[str, Any] = json.load(f)
    return report


def summarize(row: dict[str, Any]) -> dict[str, float | int | None]:
    """One row's figures (None where its samples do not say: an older report, a server
    without our stats)."""
    samples = [s for s in row["samples"] if s["error"] is None and s["ttft_s"] is not None]
    if not samples:
        return {"requests": 0}
    decode = [(s["e2e_s"] - s["ttft_s"]) / (s["completion_tokens"] - 1)
              for s in samples if s["completion_tokens"] > 1]
    staged = [s for s in samples if s.get("stage_seconds") and s.get("num_rounds")]
    rounds = sum(s["num_rounds"] for s in staged)
    verify = sum(s["stage_seconds"].get("verify", 0.0) for s in staged)
    prefill = [s["stage_seconds"].get("prefill", 0.0) for s in staged]
    firsts = {round(s["start_s"] + s["ttft_s"], 4) for s in samples}
    return {
        "requests": len(samples),
        "tok_s": row["output_throughput"]["median"],
        "ttft_ms": 1e3 * statistics.mean(s["ttft_s"] for s in samples),
        "decode_ms_per_token": 1e3 * statistics.mean(decode) if decode else None,
        "verify_ms_per_round": 1e3 * verify / rounds if rounds else None,
        "prefill_ms_per_request": 1e3 * statistics.mean(prefill) if prefill else None,
        "first_token_times": len(firsts),
    }


def _fmt(value: float | int | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    print("report | row | tok/s | TTFT ms | decode ms/token | verify ms/round | "
          "prefill ms/request | first-token times / requests")
    for name in argv:
        report = load(Path(name))
        for row in report["rows"]:
            f = summarize(row)
            label = f"{row['target']} {row['mode']} c{row['concurrency']}"
            print(f"{Path(name).name} | {label} | {_fmt(f.get('tok_s'), 1)} | "
                  f"{_fmt(f.get('ttft_ms'), 2)} | {_fmt(f.get('decode_ms_per_token'), 4)} | "
                  f"{_fmt(f.get('verify_ms_per_round'), 4)} | "
                  f"{_fmt(f.get('prefill_ms_per_request'), 3)} | "
                  f"{f.get('first_token_times', '-')} / {f['requests']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
