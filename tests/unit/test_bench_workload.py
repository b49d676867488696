"""What `ddtree bench` sends: prompt sources (HumanEval from the wheel, FastChat `turns`
and `prompt` JSONL, the seed preset, synthetic lengths), the grid and load flags, and the
clock rules of one measured request."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ddtree.benchmark.config import LoadPoint, SpecPoint
from ddtree.benchmark.metrics import acceptance_length, percentiles, spread, summed_histogram
from ddtree.benchmark.sample import RequestSample
from ddtree.benchmark.workload import PromptSources, prompt_texts
from ddtree.cli import build_parser
from ddtree.cli.bench import config_from_args
from ddtree.errors import InvalidArgumentError
from ddtree.models.tiny import make_tiny_pair
from ddtree.prompts import HUMANEVAL_CHAT_PREFIX, SEED_PROMPTS, humaneval_path


def bench_args(*argv: str):  # noqa: ANN201 (argparse.Namespace)
    return build_parser().parse_args(["bench", *argv])


def test_humaneval_by_name_loads_the_164_problems_of_the_wheel() -> None:
    assert humaneval_path().name == "HumanEval.jsonl.gz"
    chat = prompt_texts(PromptSources(("humaneval",)), None)["humaneval"]
    raw = prompt_texts(PromptSources(("humaneval",), is_chat=False), None)["humaneval"]
    assert len(chat) == len(raw) == 164
    assert chat[0] == HUMANEVAL_CHAT_PREFIX + raw[0] and raw[0].startswith("from typing")


def test_no_source_means_humaneval_and_num_prompts_takes_the_first() -> None:
    sets = prompt_texts(PromptSources(num_prompts=3), None)
    assert list(sets) == ["humaneval"] and len(sets["humaneval"]) == 3


def test_fastchat_turns_and_plain_prompt_files_load_as_named_sets(tmp_path: Path) -> None:
    turns, plain = tmp_path / "mt_bench.jsonl", tmp_path / "mine.jsonl"
    turns.write_text(json.dumps({"question_id": 1, "turns": ["first", "second"]}) + "\n")
    plain.write_text(json.dumps({"prompt": "def f():"}) + "\n\n")
    sets = prompt_texts(PromptSources((str(turns), str(plain))), None)
    assert sets == {"mt_bench": ["first"], "mine": ["def f():"]}


def test_preset_seed_is_the_three_prompts_at_256_tokens_and_temperature_0() -> None:
    config = config_from_args(bench_args("--preset", "seed", "--temperature", "0.7"))
    assert config.settings.max_tokens == 256 and config.settings.temperature == 0.0
    sets = prompt_texts(PromptSources(preset="seed"), None)
    assert sets == {"seed": list(SEED_PROMPTS)} and len(SEED_PROMPTS) == 3


def test_synthetic_prompts_have_the_requested_token_length(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    target, _ = make_tiny_pair(tmp_path, family="llama")
    tokenizer = AutoTokenizer.from_pretrained(target)
    texts = prompt_texts(PromptSources(synthetic_input_len=40, num_prompts=3), tokenizer)
    (name, prompts), = texts.items()
    assert name == "synthetic-40" and len(prompts) == 3
    for text in prompts:
        assert 36 <= len(tokenizer(text, add_special_tokens=False)["input_ids"]) <= 40
    settings = config_from_args(bench_args("--synthetic-input-len", "40",
                                           "--synthetic-output-len", "16")).settings
    assert settings.max_tokens == 16 and settings.ignore_eos


def test_grid_flags_expand_tree_modes_over_budgets_and_topk() -> None:
    config = config_from_args(bench_args("--modes", "ar,tree,shadow", "--budgets", "15,32",
                                         "--max-topk", "none,8", "--concurrency", "1,8"))
    assert [s.label for s in config.specs] == [
        "ar", "tree b15", "tree b15 k8", "tree b32", "tree b32 k8",
        "shadow b15", "shadow b15 k8", "shadow b32", "shadow b32 k8"]
    assert config.loads == (LoadPoint(1), LoadPoint(8))
    assert SpecPoint("tree", 15, 8).serve_flags() == "--mode tree --budget 15 --max-topk 8"


def test_request_rates_are_open_loop_points_capped_by_concurrency() -> None:
    config = config_from_args(bench_args("--url", "http://x", "--request-rate", "2,inf",
                                         "--concurrency", "4"))
    assert config.loads == (LoadPoint(4, 2.0), LoadPoint(4, math.inf))
    assert [s.mode for s in config.specs] == ["server"]  # a URL gets no ddtree extension


@pytest.mark.parametrize("argv", [["--modes", "fast"], ["--budgets", "0"], ["--repeats", "0"],
                                  ["--request-rate", "-1"], ["--modes", "server"]])
def test_bad_grid_flags_are_refused(argv: list[str]) -> None:
    with pytest.raises(InvalidArgumentError):
        config_from_args(bench_args(*argv))


def test_a_sample_times_ttft_tpot_and_itl_from_its_chunks() -> None:
    # Sent at t=10, chunks at 10.5 (1 token), 10.7 and 11.0 (4 tokens in all), done at 11.1.
    sample = RequestSample(0, start=10.0, end=11.1, chunk_times=[10.5, 10.7, 11.0],
                           completion_tokens=4, acceptance_histogram=[0, 1, 1])
    assert sample.ttft_s == pytest.approx(0.5)
    assert sample.itl_s == pytest.approx([0.2, 0.3])
    assert sample.tpot_s == pytest.approx(0.6 / 3)
    assert sample.tokens_per_second == pytest.approx(5.0)
    assert sample.e2e_tokens_per_second == pytest.approx(4 / 1.1)
    assert acceptance_length(summed_histogram([sample, sample])) == 1.5


def test_percentiles_and_spreads() -> None:
    assert percentiles(list(range(1, 101)), 1000.0) == {
        "p50": 50500.0, "p90": 90100.0, "p99": 99010.0, "mean": 50500.0}
    assert percentiles([]) is None
    assert spread([3.0, None, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}
