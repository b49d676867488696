"""scripts/gpu/stage_summary.py: a bench row's per-request figures from its samples (TTFT,
decode time a token, the server's device time a round, prefill, lockstep waves), run as
the lease runs it, on a gzipped report."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def sample(start: float, ttft: float, e2e: float, tokens: int, rounds: int | None,
           stages: dict[str, float] | None) -> dict[str, Any]:
    return {"start_s": start, "ttft_s": ttft, "e2e_s": e2e, "completion_tokens": tokens,
            "num_rounds": rounds, "stage_seconds": stages, "error": None}


def test_a_rows_figures_come_from_its_samples(tmp_path: Path) -> None:
    samples = [  # two requests prefilled together (one first-token time), one alone
        sample(0.0, 0.010, 0.110, 101, 100, {"prefill": 0.002, "verify": 0.080}),
        sample(0.0, 0.010, 0.210, 101, 100, {"prefill": 0.004, "verify": 0.090}),
        sample(0.5, 0.020, 0.120, 51, None, None),  # no stats (a foreign server's)
    ]
    row = {"target": "url", "mode": "ar", "concurrency": 2, "samples": samples,
           "output_throughput": {"median": 1234.5}}
    path = tmp_path / "report.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"rows": [row]}, f)
    out = subprocess.run([sys.executable, str(REPO / "scripts/gpu/stage_summary.py"),
                          str(path)], capture_output=True, text=True, check=True).stdout
    line = out.splitlines()[1].split(" | ")
    assert line[1:3] == ["url ar c2", "1234.5"]
    assert line[3] == "13.33"  # TTFT ms: (10 + 10 + 20) / 3
    assert float(line[4]) == round((1.0 + 2.0 + 2.0) / 3, 4)  # decode ms a token
    assert float(line[5]) == 0.85  # verify: 170 ms over 200 rounds
    assert float(line[6]) == 3.0  # prefill ms a request, over the two with stats
    assert line[7] == "2 / 3"
