"""scripts/soak.py, small and fast: a `ddtree serve` of the tiny pair it starts itself,
two clients for a few seconds, the drafter SIGKILLed every two seconds, clients hanging up
at random. Nothing fails, is lost or differs from ar at T=0, and no KV slot leaks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.integration.conftest import REPO


def test_a_short_soak_loses_nothing_and_leaks_nothing(tiny_pair: Path, tmp_path: Path) -> None:
    report_path = tmp_path / "soak.json"
    result = subprocess.run(
        [sys.executable, "scripts/soak.py", "--start", "--target", str(tiny_pair / "target"),
         "--drafter", str(tiny_pair / "drafter"), "--device", "cpu", "--dtype", "float32",
         "--concurrency", "2", "--duration-s", "8", "--kill-drafter-every-s", "2",
         "--disconnect-prob", "0.2", "--max-tokens", "12", "--settle-s", "20",
         "--json-out", str(report_path)],
        cwd=REPO, capture_output=True, text=True, timeout=400)
    assert report_path.is_file(), result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert result.returncode == 0, (report, result.stderr[-3000:])
    assert report["completed"] > 0 and report["num_drafter_kills"] >= 1
    assert report["failed"] == report["lost"] == report["mismatched"] == 0, report["errors"]
    assert not report["leaked"] and report["pool_after_load"]["kv_usage"] == 0
    assert report["latency_s"]["p50"] is not None and report["serve_exit_code"] == 0
