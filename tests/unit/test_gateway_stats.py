"""Speculation stats on responses and in Prometheus: merging choices, the fallback for
generations the gateway ended itself, and vLLM / SGLang-style metric names."""

from __future__ import annotations

import pytest
from prometheus_client import Histogram
from prometheus_client.parser import text_string_to_metric_families

from ddtree.v1 import common_pb2, verifier_pb2
from gateway.generation import fallback_stats
from gateway.metrics import Metrics, observe_many
from gateway.responses import stats_json


def spec_stats(histogram: list[int], nodes: int) -> common_pb2.SpecStats:
    rounds = sum(histogram)
    tokens = sum(i * n for i, n in enumerate(histogram))
    return common_pb2.SpecStats(
        mode="tree", budget=8, num_rounds=rounds, acceptance_histogram=histogram,
        mean_acceptance_length=tokens / rounds, num_drafted_nodes=nodes,
        num_accepted_draft_tokens=tokens - rounds, stage_seconds={"verify": 0.5, "draft": 0.25})


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "model_name"))
            out[(sample.name, labels)] = sample.value
    return out


def test_one_choice_reports_its_own_stats() -> None:
    stats = stats_json([spec_stats([0, 2, 1, 1], nodes=32)])
    assert stats["num_rounds"] == 4
    assert stats["mean_acceptance_length"] == 1.75
    assert stats["acceptance_histogram"] == [0, 2, 1, 1]
    assert (stats["num_drafted_nodes"], stats["num_accepted_draft_tokens"]) == (32, 3)
    assert (stats["mode"], stats["budget"]) == ("tree", 8)


def test_choices_are_summed() -> None:
    stats = stats_json([spec_stats([0, 2, 1, 1], 32), spec_stats([0, 0, 2], 16)])
    assert stats["acceptance_histogram"] == [0, 2, 3, 1]
    assert stats["num_rounds"] == 6 and stats["mean_acceptance_length"] == round(11 / 6, 4)
    assert stats["stage_seconds"] == {"draft": 0.5, "verify": 1.0}


def test_fallback_stats_come_from_the_round_messages() -> None:
    request = verifier_pb2.GenerateRequest(
        prompt_ids=[1, 2, 3], spec=common_pb2.SpecParams(mode=common_pb2.MODE_LINEAR, budget=4))
    stats = fallback_stats(request, [(3, 4), (1, 4), (2, 4)])  # three rounds of a chain of 4
    assert (stats.mode, stats.budget, stats.num_rounds) == ("linear", 4, 3)
    assert list(stats.acceptance_histogram) == [0, 1, 1, 1]
    assert stats.num_accepted_draft_tokens == 3 and stats.num_prompt_tokens == 3
    assert stats.num_drafted_nodes == 12


def test_metrics_count_drafts_acceptance_per_position_and_accept_length() -> None:
    metrics = Metrics("tiny")
    metrics.observe_stats(spec_stats([0, 2, 1, 1], nodes=32))  # rounds committing 1, 1, 2, 3
    values = samples(metrics)
    assert values[("ddtree:spec_decode_num_drafts_total", ())] == 4
    assert values[("ddtree:spec_decode_num_draft_tokens_total", ())] == 32
    assert values[("ddtree:spec_decode_num_accepted_tokens_total", ())] == 3
    per_pos = "ddtree:spec_decode_num_accepted_tokens_per_pos_total"
    assert values[(per_pos, (("position", "0"),))] == 2  # rounds that accepted >= 1 draft
    assert values[(per_pos, (("position", "1"),))] == 1
    assert values[("ddtree:spec_accept_length", ())] == 1.75
    stage = ("ddtree:spec_round_stage_seconds_count", (("stage", "verify"),))
    assert values[stage] == 1


def test_ar_generations_count_no_drafts() -> None:
    metrics = Metrics("tiny")
    metrics.observe_stats(spec_stats([0, 5], nodes=0))
    assert ("ddtree:spec_decode_num_drafts_total", ()) not in samples(metrics)


def test_latency_histograms_spread_a_round_over_its_tokens() -> None:
    metrics = Metrics("tiny")
    metrics.observe_tokens(0.5, [(0.3, 3), (0.1, 1)])
    values = samples(metrics)
    assert values[("ddtree:time_to_first_token_seconds_count", ())] == 1
    assert values[("ddtree:inter_token_latency_seconds_count", ())] == 4
    assert abs(values[("ddtree:inter_token_latency_seconds_sum", ())] - 0.4) < 1e-9


def test_observe_many_matches_one_observe_per_token() -> None:
    # Values on bucket bounds, between them, past the last finite one, and zero.
    observations = [(0.001, 2), (0.0011, 1), (0.0, 3), (0.04, 5), (700.0, 1), (0.3, 4),
                    (0.0025, 0)]
    bulk, one_by_one = Histogram("h", "h", registry=None), Histogram("h", "h", registry=None)
    observe_many(bulk, observations)
    for value, times in observations:
        for _ in range(times):
            one_by_one.observe(value)
    got, want = bulk.collect()[0].samples, one_by_one.collect()[0].samples
    exact = {"h_bucket", "h_count"}
    assert [s for s in got if s.name in exact] == [s for s in want if s.name in exact]
    assert [s.value for s in got if s.name == "h_sum"] == pytest.approx(
        [s.value for s in want if s.name == "h_sum"])

    class NoBuckets:  # a histogram child without prometheus_client's attributes
        def __init__(self) -> None:
            self.seen: list[float] = []

        def observe(self, value: float) -> None:
            self.seen.append(value)

    child = NoBuckets()
    observe_many(child, [(0.5, 2), (0.1, 1)])
    assert child.seen == [0.5, 0.5, 0.1]
