"""Prometheus metrics named like the engines users already scrape: vLLM's spec-decode
counters, SGLang's accept-length gauge, and latency histograms (TTFT, inter-token,
end-to-end, per-stage round time). Everything is fed from the gateway's side of the wire
(per-request SpecStats arrive with the last message), so none of it touches the decode loop.
"""

from __future__ import annotations

from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ddtree.v1 import common_pb2

PREFIX = "ddtree:"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3,
                    0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
_STAGE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                  0.25, 0.5, 1.0, 2.5)
# The accept-length gauge averages over this many recent requests.
NUM_RECENT_REQUESTS = 64


class Metrics:
    """One registry per app (tests run several apps in one process)."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        labels = ["model_name"]

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(PREFIX + name, doc, [*labels, *extra], registry=self.registry)

        def histogram(name: str, doc: str, buckets: tuple[float, ...],
                      extra: tuple[str, ...] = ()) -> Histogram:
            return Histogram(PREFIX + name, doc, [*labels, *extra], buckets=buckets,
                             registry=self.registry)

        self.num_drafts = counter("spec_decode_num_drafts", "Verify rounds that had a draft.")
        self.num_draft_tokens = counter(
            "spec_decode_num_draft_tokens", "Draft tree nodes sent to verification.")
        self.num_accepted_tokens = counter(
            "spec_decode_num_accepted_tokens", "Draft tokens accepted by the target.")
        self.num_accepted_per_pos = counter(
            "spec_decode_num_accepted_tokens_per_pos",
            "Accepted draft tokens by depth in the draft (0 = first drafted token).",
            ("position",))
        self.accept_length = Gauge(
            PREFIX + "spec_accept_length",
            f"Tokens committed per verify round, bonus included (last {NUM_RECENT_REQUESTS} "
            "requests).", labels, registry=self.registry)
        self.ttft = histogram("time_to_first_token_seconds", "Time to first token.",
                              _LATENCY_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds",
                             "Time per output token after the first.", _LATENCY_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Request latency.",
                             _LATENCY_BUCKETS)
        self.stage = histogram("spec_round_stage_seconds",
                               "Mean time per verify round in each stage of a request "
                               "(prefill: once per request).", _STAGE_BUCKETS, ("stage",))
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = counter("generation_tokens", "Completion tokens returned.")
        self.request_success = counter("request_success", "Finished choices.",
                                       ("finished_reason",))
        self.running = Gauge(PREFIX + "num_requests_running", "Generations in flight.",
                             labels, registry=self.registry)
        self._recent: deque[tuple[int, int]] = deque(maxlen=NUM_RECENT_REQUESTS)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def observe_tokens(self, ttft_s: float | None, gaps: list[tuple[float, int]]) -> None:
        """`gaps`: (seconds since the previous message, tokens in it) after the first."""
        model = self.model_name
        if ttft_s is not None:
            self.ttft.labels(model).observe(ttft_s)
        for seconds, num_tokens in gaps:
            for _ in range(num_tokens):  # each token of a round waited its share
                self.itl.labels(model).observe(seconds / num_tokens)

    def observe_choice(self, finish_reason: str, num_prompt_tokens: int,
                       num_completion_tokens: int, e2e_s: float) -> None:
        model = self.model_name
        self.request_success.labels(model, finish_reason or "abort").inc()
        self.prompt_tokens.labels(model).inc(num_prompt_tokens)
        self.generation_tokens.labels(model).inc(num_completion_tokens)
        self.e2e.labels(model).observe(e2e_s)

    def observe_stats(self, stats: common_pb2.SpecStats) -> None:
        model = self.model_name
        hist = list(stats.acceptance_histogram)
        if stats.num_drafted_nodes > 0:
            self.num_drafts.labels(model).inc(stats.num_rounds)
            self.num_draft_tokens.labels(model).inc(stats.num_drafted_nodes)
            self.num_accepted_tokens.labels(model).inc(stats.num_accepted_draft_tokens)
            # A round that committed a tokens accepted draft positions 0 .. a-2.
            for position in range(max(0, len(hist) - 2)):
                count = sum(hist[position + 2:])
                if count:
                    self.num_accepted_per_pos.labels(model, str(position)).inc(count)
        if stats.num_rounds:
            tokens = sum(i * n for i, n in enumerate(hist))
            self._recent.append((tokens, sum(hist)))
            rounds = sum(r for _, r in self._recent)
            self.accept_length.labels(model).set(sum(t for t, _ in self._recent) / max(rounds, 1))
        for stage, seconds in stats.stage_seconds.items():
            per_round = seconds if stage == "prefill" else seconds / max(stats.num_rounds, 1)
            self.stage.labels(model, stage).observe(per_round)
