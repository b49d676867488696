"""scripts/gpu/ar_mismatches.py, the lease's T = 0 check of bench reports against ar: it
compares token ids where both sides carry them and texts otherwise (the gateway's reports
carry texts only), finds a differing sample, and fails when it compared nothing."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _report(path: Path, mode: str, samples: list[dict[str, Any]]) -> Path:
    rows = [{"mode": mode, "concurrency": 1, "samples": [
        {"prompt_index": i, "repeat": 0, "error": None, **sample}
        for i, sample in enumerate(samples)]}]
    with gzip.open(path, "wt") as f:
        json.dump({"rows": rows}, f)
    return path


def _check(*paths: Path) -> tuple[int, str]:
    result = subprocess.run([sys.executable, "scripts/gpu/ar_mismatches.py",
                             *map(str, paths)], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    return result.returncode, result.stdout


def test_gateway_reports_are_compared_by_text(tmp_path: Path) -> None:
    ar = _report(tmp_path / "ar.json.gz", "ar",
                 [{"text": "def f():", "token_ids": None}, {"text": "return 1", "token_ids": None}])
    same = _report(tmp_path / "same.json.gz", "tree",
                   [{"text": "def f():", "token_ids": None},
                    {"text": "return 1", "token_ids": None}])
    other = _report(tmp_path / "other.json.gz", "tree",
                    [{"text": "def f():", "token_ids": None},
                     {"text": "return 2", "token_ids": None}])
    assert _check(same, ar) == (0, "0 samples differ from ar (2 of 2 compared)\n")
    code, out = _check(other, ar)
    assert code == 0  # every sample was compared; the one that differs is named
    assert "prompt 1" in out and "first text diff at 7" in out
    assert out.endswith("1 samples differ from ar (2 of 2 compared)\n")


def test_token_ids_are_compared_where_both_carry_them(tmp_path: Path) -> None:
    ar = _report(tmp_path / "ar.json.gz", "ar", [{"text": "a", "token_ids": [1, 2, 3]}])
    tree = _report(tmp_path / "tree.json.gz", "tree", [{"text": "a", "token_ids": [1, 2, 4]}])
    code, out = _check(tree, ar)
    assert code == 0 and "first token_ids diff at 2" in out


def test_nothing_compared_is_a_failure(tmp_path: Path) -> None:
    tree = _report(tmp_path / "tree.json.gz", "tree", [{"text": "a", "token_ids": None}])
    assert _check(tree) == (1, "0 samples differ from ar (0 of 1 compared)\n")
