"""`ddtree bench --url` against the three real services on loopback: every mode through
the `ddtree` extension, closed-loop concurrency with repeats, token counts that are the
server's usage (= the target's own greedy tokens up to EOS), every T=0 row equal to ar,
the report valid against its schema, the plots; then an open loop with a baseline server."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from ddtree.benchmark.report import schema
from ddtree.cli import main
from ddtree.models.target import TargetModel
from tests.e2e.conftest import Stack

PROMPTS = ("hello there", "the quick brown fox", "def add(a, b):")
MAX_TOKENS = 8
REPEATS = 2
CONCURRENCY = 3


def bench(*argv: str) -> str:
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["bench", "--no-progress", *argv]) == 0
    return stdout.getvalue()


def max_in_flight(samples: list[dict[str, Any]]) -> int:
    events = sorted([(s["start_s"], 1) for s in samples]
                    + [(s["start_s"] + s["e2e_s"], -1) for s in samples])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


@pytest.fixture(scope="module")
def closed_loop(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("bench-url")
    prompts = root / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"turns": [p]}) for p in PROMPTS))
    out = root / "report.json"
    table = bench("--url", stack.base_url, "--prompts", str(prompts),
                  "--modes", "ar,linear,tree,shadow", "--budgets", "4,12",
                  "--concurrency", f"1,{CONCURRENCY}", "--repeats", str(REPEATS),
                  "--max-tokens", str(MAX_TOKENS), "--warmup", "1", "--json-out", str(out),
                  "--plot", str(root / "plots"))
    return {"report": json.loads(out.read_text()), "table": table, "plots": root / "plots"}


def test_concurrency_and_repeats_count_the_servers_usage_tokens(
    closed_loop: dict[str, Any], target: TargetModel,
    chat_prompt_ids: Callable[[list[dict[str, str]]], list[int]],
    greedy: Callable[[list[int], int], list[int]],
) -> None:
    expected = []  # the target's greedy tokens, cut at its first EOS as the server does
    for prompt in PROMPTS:
        tokens = greedy(chat_prompt_ids([{"role": "user", "content": prompt}]), MAX_TOKENS)
        stop = [i for i, t in enumerate(tokens) if t in target.config.eos_token_ids]
        expected.append(len(tokens[:stop[0]] if stop else tokens))
    rows = closed_loop["report"]["rows"]
    assert len(rows) == 6 * 2  # ar, linear, tree x2, shadow x2; concurrency 1 and 3
    for row in rows:
        samples = row["samples"]
        assert row["num_failed"] == 0 and len(samples) == REPEATS * len(PROMPTS)
        assert [s["completion_tokens"] for s in samples if s["repeat"] == 0] != []
        for s in samples:
            assert s["completion_tokens"] == expected[s["prompt_index"]]
            # the gateway's ddtree_stats: the verifier's stage times over the request
            assert s["stage_seconds"]["prefill"] > 0 and s["stage_seconds"]["verify"] > 0
        assert row["completion_tokens"] == REPEATS * sum(expected)
        assert row["acceptance_length"] >= 1.0  # our gateway's stats
        for run in row["runs"]:
            assert run["output_throughput"] == pytest.approx(
                run["completion_tokens"] / run["wall_s"], rel=1e-3)
            # the client's own CPU per wall second: one asyncio process (its threads add
            # little), so it stays near or below one core
            assert 0 < run["client_cores"] < 1.5
        if row["concurrency"] == CONCURRENCY:
            for repeat in range(REPEATS):
                assert max_in_flight([s for s in samples if s["repeat"] == repeat]) == CONCURRENCY


def test_every_t0_row_over_http_serves_the_ar_text(closed_loop: dict[str, Any]) -> None:
    rows = closed_loop["report"]["rows"]
    assert all(row["matches_ar"] is True for row in rows)
    assert {(r["mode"], r["served_mode"]) for r in rows} == {
        ("ar", "ar"), ("linear", "linear"), ("tree", "tree"), ("shadow", "shadow")}
    assert " NO" not in closed_loop["table"]


def test_the_url_report_validates_and_its_plots_are_written(closed_loop: dict[str, Any]) -> None:
    jsonschema.validate(closed_loop["report"], schema())
    names = {p.name for p in closed_loop["plots"].iterdir()}
    assert {"budget_prompts_c1.png", "budget_prompts_c3.png", "concurrency_prompts.png",
            "acceptance_prompts.png"} == names


def test_poisson_load_with_a_baseline_server(stack: Stack, tmp_path: Path) -> None:
    out = tmp_path / "rate.json"
    bench("--url", stack.base_url, "--baseline-url", stack.base_url, "--preset", "seed",
          "--max-tokens", "4", "--request-rate", "50", "--num-requests", "4", "--warmup", "0",
          "--json-out", str(out))
    report = json.loads(out.read_text())
    jsonschema.validate(report, schema())
    rows = report["rows"]
    assert [(r["target"], r["mode"], r["request_rate"]) for r in rows] == [
        ("url", "server", 50.0), ("baseline-url", "server", 50.0)]
    assert all(r["num_requests"] == 4 and r["num_failed"] == 0 for r in rows)
    assert rows[1]["matches_ar"] is None  # no ar row in this run


def test_duration_bounds_a_closed_loop_that_cycles_the_prompts(stack: Stack,
                                                               tmp_path: Path) -> None:
    out = tmp_path / "duration.json"
    bench("--url", stack.base_url, "--modes", "ar", "--preset", "seed", "--max-tokens", "2",
          "--concurrency", "2", "--duration", "1.5", "--warmup", "0", "--json-out", str(out))
    (row,) = json.loads(out.read_text())["rows"]
    starts = [s["start_s"] for s in row["samples"]]
    assert row["num_requests"] > 3  # more than the three seed prompts: they cycle
    assert max(starts) < 1.5 <= row["runs"][0]["wall_s"]
    assert {s["prompt_index"] for s in row["samples"]} == {0, 1, 2}


def test_raw_prompts_are_completions_and_tree_still_serves_the_ar_text(stack: Stack,
                                                                       tmp_path: Path) -> None:
    out = tmp_path / "raw.json"
    bench("--url", stack.base_url, "--raw", "--modes", "ar,tree", "--budgets", "8",
          "--preset", "seed", "--max-tokens", "6", "--warmup", "0", "--json-out", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [r["mode"] for r in rows] == ["ar", "tree"]
    assert all(r["matches_ar"] is True and r["completion_tokens"] > 0 for r in rows)
