"""`ddtree bench`: the four modes side by side on a prompt file, in one process; at T=0
each row says whether it served the ar tokens (it must)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddtree.cli import main
from ddtree.models.tiny import make_tiny_pair


def test_bench_runs_every_mode_and_every_row_matches_ar(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    make_tiny_pair(tmp_path / "pair", family="qwen3")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"turns": [t]}) for t in ("hello", "the sea")))
    out = tmp_path / "rows.json"
    code = main(["bench", "--target", str(tmp_path / "pair/target"),
                 "--drafter", str(tmp_path / "pair/drafter"), "--device", "cpu",
                 "--prompts", str(prompts), "--budgets", "4,12", "--max-tokens", "12",
                 "--json-out", str(out)])
    assert code == 0
    rows = json.loads(out.read_text())
    assert [(r["mode"], r["budget"]) for r in rows] == [
        ("ar", 1), ("linear", 1), ("tree", 4), ("tree", 12), ("shadow", 4), ("shadow", 12)]
    assert all(r["matches_ar"] is True and r["num_prompts"] == 2 for r in rows)
    assert all(r["acceptance_length"] >= 1.0 for r in rows)
    table = capsys.readouterr().out
    assert "=ar" in table and " NO" not in table
