"""Prometheus metrics named like the engines users already scrape: vLLM's spec-decode
counters, SGLang's accept-length gauge, and latency histograms (TTFT, inter-token,
end-to-end, per-stage round time). Per-request figures are fed from the gateway's side of
the wire (per-request SpecStats arrive with the last message), so none of it touches the
decode loop; the engine's load (running, waiting, KV usage, batch sizes) is the verifier's
GetStats, read at scrape time.

Every family is exposed as `ddtree:<name>` and, where vLLM has the same metric, ALSO under
vLLM's name and labels (`vllm:<name>{model_name=...}`), so dashboards and alerts built for
vLLM work unchanged (docs/operations.md, docs/grafana-dashboard.json).

Several gateway processes on one port (`ddtree serve --gateway-workers N`) share their
figures through prometheus_client's multiprocess mode, as vLLM's API servers do: with
PROMETHEUS_MULTIPROC_DIR set (before prometheus_client is imported) every process writes
its values there and any of them answers /metrics with the sums over all (counters,
histograms, the in-flight gauge over live processes; the accept-length gauge is the most
recent value set).
"""

from __future__ import annotations

import bisect
import os
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from ddtree.v1 import common_pb2, verifier_pb2

PREFIX = "ddtree:"
VLLM_PREFIX = "vllm:"
# Our families that vLLM exposes with the same meaning, type and labels.
VLLM_ALIASES = frozenset({
    "time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
    "prompt_tokens", "generation_tokens", "request_success", "spec_decode_num_drafts",
    "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
    "spec_decode_num_accepted_tokens_per_pos", "num_requests_running", "num_requests_waiting",
    "kv_cache_usage_perc",
})
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3,
                    0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
_STAGE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                  0.25, 0.5, 1.0, 2.5)
# The accept-length gauge averages over this many recent requests.
NUM_RECENT_REQUESTS = 64


def observe_many(child: Any, observations: list[tuple[float, int]]) -> None:
    """Observes each (value, times) `times` times: as many `observe` calls would, but one
    increment per bucket (a request's inter-token latencies are observed at its end, one
    per token: 256 `observe` calls held the gateway's event loop ~0.2-0.5 ms, just when
    the next request of a closed loop arrives). Falls back to `observe` on a histogram
    child without prometheus_client's bucket attributes."""
    bounds = getattr(child, "_upper_bounds", None)
    buckets, total = getattr(child, "_buckets", None), getattr(child, "_sum", None)
    if bounds is None or buckets is None or total is None:
        for value, times in observations:
            for _ in range(times):
                child.observe(value)
        return
    counts = [0] * len(bounds)
    amount = 0.0
    for value, times in observations:
        counts[bisect.bisect_left(bounds, value)] += times  # the first bound >= value
        amount += value * times
    total.inc(amount)
    for i, count in enumerate(counts):
        if count:
            buckets[i].inc(count)


class _Batched:
    """One histogram child's per-message and per-event observations, added in bulk
    (`observe_many`: one bisect a value, one increment a bucket) when `FLUSH_EVERY` are
    waiting, a choice ends or /metrics is rendered: a prometheus_client `observe` scans
    the buckets and takes two locks, twice an event at ar c8 (~8,000 events a second on
    the gateway's loop)."""

    FLUSH_EVERY = 256

    def __init__(self, child: Any) -> None:
        self.child = child
        self.values: list[tuple[float, int]] = []

    def since(self, sent_unix_s: float) -> None:
        if sent_unix_s > 0:
            self.values.append((max(0.0, time.time() - sent_unix_s), 1))
            if len(self.values) >= self.FLUSH_EVERY:
                self.flush()

    def flush(self) -> None:
        values, self.values = self.values, []
        if values:
            observe_many(self.child, values)


def vllm_alias(metric: Metric) -> Metric:
    """The same family under vLLM's name."""
    name = VLLM_PREFIX + metric.name[len(PREFIX):]
    alias = Metric(name, metric.documentation, metric.type, metric.unit)
    alias.samples = [s._replace(name=VLLM_PREFIX + s.name[len(PREFIX):]) for s in metric.samples]
    return alias


def engine_families(model: str, stats: verifier_pb2.EngineStats) -> Iterator[Metric]:
    """The verifier's GetStats as gauges, counters and the batch-size histogram."""
    def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(PREFIX + name, doc, labels=["model_name"])
        family.add_metric([model], value)
        return family

    def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(PREFIX + name, doc, labels=["model_name"])
        family.add_metric([model], value)
        return family

    yield gauge("num_requests_running", "Generations decoding in the engine.", stats.num_running)
    yield gauge("num_requests_waiting", "Generations queued for a KV slot.", stats.num_waiting)
    yield gauge("kv_cache_usage_perc", "Fraction of the KV pool in use (1 = full).",
                stats.kv_usage)
    yield gauge("num_open_sessions", "OpenSession (Verify client) sessions holding a KV slot.",
                stats.num_open_sessions)
    yield gauge("max_num_seqs", "KV slots in the pool.", stats.max_num_seqs)
    yield gauge("max_queue", "Queue limit (0 = none).", stats.max_queue)
    yield counter("engine_rounds", "Engine steps that ran a decoding target forward.",
                  stats.num_rounds)
    yield counter("engine_target_forwards", "Target forwards of any kind (prefill included).",
                  stats.num_target_forwards)
    yield counter("expired_sessions", "OpenSession sessions closed by the idle timeout.",
                  stats.num_expired_sessions)
    yield counter("engine_rejected", "Requests the engine refused (queue full, invalid).",
                  stats.num_rejected)
    counts = list(stats.batch_size_histogram)  # index = rows in the round's target forward
    buckets, total = [], 0
    for size, count in enumerate(counts):
        total += count
        buckets.append((str(float(size)), total))
    family = HistogramMetricFamily(PREFIX + "batch_size", "Generations per decoding target "
                                   "forward.", labels=["model_name"])
    family.add_metric([model], [*buckets, ("+Inf", total)],
                      sum_value=sum(i * c for i, c in enumerate(counts)))
    yield family


class _Exposition(Collector):
    """What /metrics shows: the gateway's own families, the engine's snapshot (set right
    before each render), each with its vLLM alias where one exists."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.snapshot: verifier_pb2.EngineStats | None = None

    def collect(self) -> Iterator[Metric]:
        shared = self.metrics.shared_dir
        families = list(MultiProcessCollector(None, shared).collect() if shared
                        else self.metrics.registry.collect())
        up = GaugeMetricFamily(PREFIX + "verifier_up", "1 when the verifier answered GetStats "
                               "at this scrape.", labels=["model_name"])
        up.add_metric([self.metrics.model_name], float(self.snapshot is not None))
        families.append(up)
        if self.snapshot is not None:
            families += engine_families(self.metrics.model_name, self.snapshot)
        for family in families:
            yield family
            if family.name[len(PREFIX):] in VLLM_ALIASES:
                yield vllm_alias(family)


class Metrics:
    """One registry per app (tests run several apps in one process); with a multiprocess
    directory /metrics shows every process's figures."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        # The directory several gateway processes share their figures in, if any.
        self.shared_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
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
            "requests).", labels, registry=self.registry, multiprocess_mode="mostrecent")
        self.ttft = histogram("time_to_first_token_seconds", "Time to first token.",
                              _LATENCY_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds",
                             "Time per output token after the first.", _LATENCY_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Request latency.",
                             _LATENCY_BUCKETS)
        self.stage = histogram("spec_round_stage_seconds",
                               "Mean time per verify round in each stage of a request "
                               "(prefill: once per request).", _STAGE_BUCKETS, ("stage",))
        self.read = histogram("verifier_read_seconds",
                              "From the verifier building a message to the gateway's event "
                              "loop taking it from the shared GenerateMany stream's reader "
                              "thread (one host's wall clock).", _STAGE_BUCKETS)
        self.hop = histogram("verifier_hop_seconds",
                             "From the verifier building a generation's message to the "
                             "gateway taking it up (one host's wall clock).", _STAGE_BUCKETS)
        self.delivery = histogram("delivery_seconds",
                                  "From the verifier building a generation's message to its "
                                  "event written to the client (one host's wall clock).",
                                  _STAGE_BUCKETS)
        # The first token's way, stage by stage (what TTFT is made of through the services)
        self.prepare = histogram("request_prepare_seconds",
                                 "From a request's arrival at the gateway to its generation's "
                                 "start (body, validation, chat template, tokenization).",
                                 _STAGE_BUCKETS)
        self.start = histogram("verifier_start_seconds",
                               "From the gateway starting a generation to the verifier reading "
                               "its request (one host's wall clock).", _STAGE_BUCKETS)
        self.first = histogram("verifier_first_token_seconds",
                               "From the verifier reading a generation's request to building "
                               "its first message (queue, admission, prefill).",
                               _LATENCY_BUCKETS)
        # Their children, labelled once: observed per message and per event (the
        # inter-token latency per token, at the request's end)
        self._itl = self.itl.labels(model_name)
        self._read = _Batched(self.read.labels(model_name))
        self._hop = _Batched(self.hop.labels(model_name))
        self._delivery = _Batched(self.delivery.labels(model_name))
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of admitted requests.")
        self.generation_tokens = counter("generation_tokens", "Completion tokens returned.")
        self.request_success = counter("request_success", "Finished choices (abort: the "
                                       "client left or the stream failed after it started).",
                                       ("finished_reason",))
        self.request_rejected = counter("request_rejected", "Requests answered with an error "
                                        "before any token (never counted as finished).",
                                        ("status",))
        self.in_flight = Gauge(PREFIX + "gateway_requests_in_flight",
                               "Generations the gateway is streaming.", labels,
                               registry=self.registry, multiprocess_mode="livesum")
        self._recent: deque[tuple[int, int]] = deque(maxlen=NUM_RECENT_REQUESTS)
        self._exposition = _Exposition(self)
        self._export = CollectorRegistry()
        self._export.register(self._exposition)

    def render(self, engine: verifier_pb2.EngineStats | None = None) -> bytes:
        """The exposition text; `engine`: the verifier's GetStats of this scrape."""
        self._flush()
        self._exposition.snapshot = engine  # no await between this and the render
        try:
            return generate_latest(self._export)
        finally:
            self._exposition.snapshot = None

    def _flush(self) -> None:
        for batched in (self._read, self._hop, self._delivery):
            batched.flush()

    def observe_read(self, sent_unix_s: float) -> None:
        """A shared-stream message taken up by the event loop now (`sent_unix_s`: when
        the verifier built it; 0 from a verifier that does not say)."""
        self._read.since(sent_unix_s)

    def observe_prepare(self, seconds: float) -> None:
        self.prepare.labels(self.model_name).observe(seconds)

    def observe_first(self, started_unix_s: float, message: verifier_pb2.GenerateResponse,
                      ) -> None:
        """A generation's first message, taken up now: the way in (from `started_unix_s`,
        when the gateway started it) and the verifier's own time to the first message."""
        received = message.received_unix_s
        if received > 0:
            self.start.labels(self.model_name).observe(max(0.0, received - started_unix_s))
            if message.sent_unix_s > 0:
                self.first.labels(self.model_name).observe(
                    max(0.0, message.sent_unix_s - received))

    def observe_hop(self, sent_unix_s: float) -> None:
        """A generation's message taken up by its consumer now."""
        self._hop.since(sent_unix_s)

    def observe_delivery(self, sent_unix_s: float) -> None:
        """An event written to the client now, carrying a message built at `sent_unix_s`."""
        self._delivery.since(sent_unix_s)

    def observe_rejected(self, status: int) -> None:
        self.request_rejected.labels(self.model_name, str(status)).inc()

    def observe_tokens(self, ttft_s: float | None, gaps: list[tuple[float, int]]) -> None:
        """`gaps`: (seconds since the previous message, tokens in it) after the first."""
        model = self.model_name
        if ttft_s is not None:
            self.ttft.labels(model).observe(ttft_s)
        # Each token of a round waited its share.
        observe_many(self._itl, [(seconds / num_tokens, num_tokens)
                                 for seconds, num_tokens in gaps if num_tokens])

    def observe_choice(self, finish_reason: str, num_prompt_tokens: int,
                       num_completion_tokens: int, e2e_s: float) -> None:
        """A choice the verifier admitted (its prefill ran), finished or not."""
        model = self.model_name
        self.request_success.labels(model, finish_reason or "abort").inc()
        self.prompt_tokens.labels(model).inc(num_prompt_tokens)
        self.generation_tokens.labels(model).inc(num_completion_tokens)
        self.e2e.labels(model).observe(e2e_s)
        # and the batched timings so far: with several gateway processes another one may
        # answer the next scrape, which cannot flush this one's
        self._flush()

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
