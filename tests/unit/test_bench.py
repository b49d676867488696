"""`ddtree bench` in one process on the tiny pair: every mode, repeats, the hf baseline,
the `=ar` check, the sweep, the JSON report against its schema, the plots, and
`ddtree bench compare`."""

from __future__ import annotations

import contextlib
import copy
import io
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from ddtree.benchmark.report import schema
from ddtree.cli import main
from ddtree.models.tiny import make_tiny_pair

REPEATS = 2
PROMPTS = ("hello", "the sea")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One in-process run: its report, its stdout and its plot folder."""
    root = tmp_path_factory.mktemp("bench")
    make_tiny_pair(root / "pair", family="qwen3")
    prompts = root / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"turns": [t]}) for t in PROMPTS))
    out, plots = root / "report.json", root / "plots"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["bench", "--target", str(root / "pair/target"),
                     "--drafter", str(root / "pair/drafter"), "--device", "cpu",
                     "--prompts", str(prompts), "--budgets", "4,12", "--max-tokens", "12",
                     "--repeats", str(REPEATS), "--baseline", "hf", "--sweep", "--no-progress",
                     "--json-out", str(out), "--plot", str(plots)])
    assert code == 0
    return {"report": json.loads(out.read_text()), "stdout": stdout.getvalue(), "plots": plots,
            "path": out}


def test_every_mode_and_the_hf_baseline_run_with_repeats(run: dict[str, Any]) -> None:
    rows = run["report"]["rows"]
    assert [(r["target"], r["mode"], r["budget"]) for r in rows] == [
        ("inprocess", "ar", None), ("inprocess", "linear", None), ("inprocess", "tree", 4),
        ("inprocess", "tree", 12), ("inprocess", "shadow", 4), ("inprocess", "shadow", 12),
        ("hf", "hf", None)]
    for row in rows:
        assert row["num_repeats"] == REPEATS and row["num_failed"] == 0
        assert row["num_requests"] == REPEATS * len(PROMPTS) == len(row["samples"])
        assert row["completion_tokens"] == sum(s["completion_tokens"] for s in row["samples"])
        assert row["request_tok_s"]["min"] <= row["request_tok_s"]["median"]
        assert row["latency_ms"]["ttft"]["p50"] > 0
    assert all(r["acceptance_length"] >= 1.0 for r in rows if r["target"] == "inprocess")
    assert rows[-1]["acceptance_length"] is None  # transformers reports no rounds


def test_every_t0_row_serves_the_ar_tokens(run: dict[str, Any]) -> None:
    rows = run["report"]["rows"]
    assert all(r["matches_ar"] is True for r in rows)
    table = run["stdout"]
    assert "=ar" in table and " NO" not in table


def test_the_report_validates_against_its_schema(run: dict[str, Any]) -> None:
    jsonschema.validate(run["report"], schema())
    env = run["report"]["environment"]
    assert env["versions"]["torch"] and "transformers" in env["versions"]


def test_sweep_prints_the_best_setting_as_serve_flags(run: dict[str, Any]) -> None:
    (best,) = run["report"]["sweep"]
    assert best["serve_flags"].startswith(f"--mode {best['mode']}")
    assert f"ddtree serve {best['serve_flags']}" in run["stdout"]


def test_plots_are_written(run: dict[str, Any]) -> None:
    names = sorted(p.name for p in run["plots"].iterdir())
    assert names == ["acceptance_prompts.png", "budget_prompts_c1.png",
                     "concurrency_prompts.png"]
    assert all((run["plots"] / n).read_bytes()[:4] == b"\x89PNG" for n in names)


def test_compare_prints_ratios_row_by_row(run: dict[str, Any], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    faster = copy.deepcopy(run["report"])
    for row in faster["rows"]:
        row["request_tok_s"] = {k: v * 2 for k, v in row["request_tok_s"].items()}
    faster["rows"][0]["concurrency"] = 4  # no longer matches: listed apart
    b = tmp_path / "b.json"
    b.write_text(json.dumps(faster))
    assert main(["bench", "compare", str(run["path"]), str(b)]) == 0
    out = capsys.readouterr().out
    assert out.count("2.00x") == len(faster["rows"]) - 1
    assert "only in A: prompts inprocess ar c1" in out
    assert "only in B: prompts inprocess ar c4" in out
