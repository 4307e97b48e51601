"""Prometheus metrics: two registries per runner app (so tests never share state).

`registry`, served at `/metrics`: names are `quorum_*`, and the seed's own names for five
of them (`vllm_requests_total`, ...) are derived from these at scrape time
(runner/telemetry/seed_metrics.py, METRICS_NAMES); `promtool check metrics` finds nothing to say.
`picker_registry`, served at PICKER_METRICS_PATH (`/metrics/picker`): the `vllm:*` family
the endpoint picker reads, its gauges (runner/telemetry/picker_metrics.py) and vLLM's own metrics
(scraped off the hot path) re-exposed beside them. A `:` is reserved for recording rules
(promtool flags it), hence the path of its own; PICKER_METRICS_PATH=/metrics merges the
two for a picker that reads `/metrics` only (`route`). Each scrape collects only what its
path writes. Tenant label values are the declared tenants (tenants file, governed
policies, TENANT_RATE_LIMIT_<tenant>), `default`, `_invalid` and `_other` for every other
id, so a client inventing tenant ids cannot blow up the series count.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from adapters.engine_families import EngineFamiliesCollector
from runner.floor.settings import PICKER_PATH
from runner.telemetry.exposition import Exposition
from runner.telemetry.metrics_port import serve_paths
from runner.telemetry.series import LabelledCounter, LabelledGauge, LabelledHistogram

METRICS_PATH = "/metrics"
OTHER_TENANT = "_other"
_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
RTF_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)
"""The speech real-time factor's buckets (runner/http/audio/metrics.py)."""


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # The request path's series are runner/telemetry/series.py's (updated without a
        # call or a lock); the others prometheus_client's.
        self.requests = LabelledCounter(
            "quorum_requests",
            "Inference requests answered, by model, tenant and status",
            ["model", "tenant", "status"],
            registry=r,
        )
        self.duration = LabelledHistogram(
            "quorum_inference_duration_seconds",
            "Time from admission to the last byte of the engine's answer",
            ["model"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.in_flight = LabelledGauge(
            "quorum_requests_in_flight",
            "Inference requests being served by an engine now",
            ["model"],
            registry=r,
        )
        self.cache_hits = Counter(
            "quorum_cache_hits_total",
            "Answers the engine served partly from its prefix cache",
            ["model"],
            registry=r,
        )
        self.cache_tokens = Counter(
            "quorum_cache_tokens_reused_total",
            "Prompt tokens served from the prefix cache",
            ["model"],
            registry=r,
        )
        self.queue_wait = LabelledHistogram(
            "quorum_queue_wait_seconds",
            "Time requests waited in the runner's queue",
            ["priority"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.rejections = Counter(
            "quorum_rejections_total",
            "Requests refused before reaching an engine",
            ["reason", "tenant"],
            registry=r,
        )
        self.tokens = LabelledCounter(
            "quorum_tenant_tokens",
            "Tokens the engines reported, by tenant, model and kind",
            ["tenant", "model", "kind"],
            registry=r,
        )
        self.write_stalls = Counter(
            "quorum_write_stalls_total",
            "Clients cut because they read nothing of their answer for WRITE_STALL_TIMEOUT_S",
            registry=r,
        )
        self.ratelimit_store_errors = Counter(
            "quorum_ratelimit_store_errors_total",
            "Rate-limit decisions that could not reach the shared store",
            registry=r,
        )
        self.lifecycle = Counter(
            "quorum_lifecycle_decisions_total",
            "Governed lifecycle calls by operation and outcome (approved, or the refusal code)",
            ["operation", "outcome"],
            registry=r,
        )
        self.load_tasks = Counter(
            "quorum_load_tasks_total",
            "Model load tasks by outcome (completed, failed, cancelled)",
            ["outcome"],
            registry=r,
        )
        self.load_seconds = Histogram(
            "quorum_model_load_seconds",
            "Time from engine start to healthy, per backend",
            ["backend"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self._answered: dict[str, int] = {}
        self._hits: dict[str, int] = {}
        r.register(_CacheHitRate(self._answered, self._hits))
        # The endpoint picker's `vllm:*` family: vLLM's own, as last scraped, and the
        # picker's gauges (registered by the runtime, runner/telemetry/picker_metrics.py).
        self.picker_registry = CollectorRegistry(auto_describe=True)
        self.vllm = EngineFamiliesCollector()
        self.picker_registry.register(self.vllm)
        # Speech (runner/http/audio/metrics.py's SpeechMetrics protocol).
        self.audio_seconds = Counter(
            "quorum_audio_seconds_total",
            "Seconds of audio transcribed or translated (segments done), by model and tenant",
            ["model", "tenant"],
            registry=r,
        )
        self.realtime_factor = Histogram(
            "quorum_audio_realtime_factor",
            "Engine time / audio duration of completed transcriptions (below 1: faster "
            "than real time)",
            ["model"],
            buckets=RTF_BUCKETS,
            registry=r,
        )
        self.transcriptions = Counter(
            "quorum_transcriptions_total",
            "Transcriptions and translations that ended, by model, tenant and outcome",
            ["model", "tenant", "status"],
            registry=r,
        )
        self.worker_restarts = Counter(
            "quorum_speech_worker_restarts_total",
            "Speech workers started again after one crashed",
            ["model"],
            registry=r,
        )
        self._tenants: frozenset[str] = frozenset({"_invalid", "default"})
        self.audio_usage: Callable[[str, str, float], None] = lambda _m, _t, _s: None
        self._children: dict[tuple[object, ...], Any] = {}
        self.exposition = Exposition(self.registry)  # what /metrics writes, and how
        self.picker_exposition = Exposition(self.picker_registry)
        self.paths: dict[str, Exposition] = {}
        self.route(PICKER_PATH)

    def route(self, picker_path: str) -> None:
        """Serve the picker's family at `picker_path` (PICKER_METRICS_PATH): on a path of
        its own, or, when that is `/metrics`, merged into `/metrics` after the runner's."""
        if picker_path == METRICS_PATH:
            self.exposition.sources = (self.registry, self.picker_registry)
            self.paths = {METRICS_PATH: self.exposition}
        else:
            self.exposition.sources = (self.registry,)
            self.paths = {METRICS_PATH: self.exposition, picker_path: self.picker_exposition}

    def api_paths(self, on_api_port: bool) -> dict[str, Exposition]:
        """The metrics paths the inference port serves: all of them, or, with
        METRICS_ON_API_PORT=false (production), not `/metrics`, whose series name tenants
        (it stays on METRICS_PORT); the picker's aggregate path stays where it reads it."""
        if on_api_port:
            return self.paths
        return {path: e for path, e in self.paths.items() if path != METRICS_PATH}

    def declare_tenants(self, tenants: Collection[str]) -> None:
        """The tenants the configuration names (file, governed policies, env): the only
        tenant label values besides `_other` and `_invalid` (a request not identified)."""
        self._tenants = frozenset(tenants) | {"_invalid", "default"}

    def tenant_label(self, tenant: str) -> str:
        """The tenant itself if declared, else `_other`: the series are bounded by the
        configuration, never by the first ids clients send."""
        return tenant if tenant in self._tenants else OTHER_TENANT

    def _child(self, metric: MetricWrapperBase, *labels: str) -> Any:
        """`metric.labels(*labels)`, cached: `labels()` costs more than the update itself."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def count_request(self, model: str, tenant: str, status: int) -> None:
        self.requests.labels(model, self.tenant_label(tenant), str(status)).value += 1
        if status == 200:
            self._answered[model] = self._answered.get(model, 0) + 1

    def begin_request(self, model: str) -> None:
        self.in_flight.labels(model).value += 1

    def end_request(self, model: str, seconds: float) -> None:
        self.in_flight.labels(model).value -= 1
        self.duration.labels(model).observe(seconds)

    def end_request_traced(self, model: str, seconds: float, trace_id: str, span_id: str) -> None:
        """`end_request` of a traced request: its duration is its bucket's exemplar."""
        self.in_flight.labels(model).value -= 1
        self.duration.labels(model).observe_traced(seconds, trace_id, span_id)

    def count_cache(self, model: str, tokens_reused: int) -> None:
        self._hits[model] = self._hits.get(model, 0) + 1
        self._child(self.cache_hits, model).inc()
        self._child(self.cache_tokens, model).inc(tokens_reused)

    def observe_queue_wait(self, priority: str, seconds: float) -> None:
        self.queue_wait.labels(priority).observe(seconds)

    def watch_queue(self, depths: Callable[[], dict[str, int]]) -> None:
        """Report `quorum_queue_depth{priority}` from `depths()` at every scrape."""
        self.registry.register(_QueueDepth(depths))

    def serve_separately(self, port: int, host: str) -> None:
        """Also serve the metrics paths on METRICS_PORT (runner/telemetry/metrics_port.py)."""
        serve_paths(port, host, self.paths, default=METRICS_PATH)

    def count_rejection(self, reason: str, tenant: str) -> None:
        self._child(self.rejections, reason, self.tenant_label(tenant)).inc()

    def count_write_stall(self) -> None:
        self.write_stalls.inc()

    def count_lifecycle(self, operation: str, outcome: str) -> None:
        self._child(self.lifecycle, operation, outcome).inc()

    def count_tokens(self, tenant: str, model: str, input_tokens: int, output_tokens: int) -> None:
        """The tokens of one answer (a negative count raises ValueError, as
        prometheus_client's counters do)."""
        label = self.tenant_label(tenant)
        if input_tokens:
            self.tokens.labels(label, model, "input").inc(input_tokens)
        if output_tokens:
            self.tokens.labels(label, model, "output").inc(output_tokens)

    def count_load(self, outcome: str) -> None:
        self._child(self.load_tasks, outcome).inc()

    def observe_load(self, backend: str, seconds: float) -> None:
        self._child(self.load_seconds, backend).observe(seconds)

    def observe_transcription(
        self, model: str, tenant: str, outcome: str, audio_seconds: float, rtf: float | None
    ) -> None:
        label = self.tenant_label(tenant)
        if audio_seconds > 0:
            self._child(self.audio_seconds, model, label).inc(audio_seconds)
            self.audio_usage(model, tenant, audio_seconds)
        if rtf is not None:
            self._child(self.realtime_factor, model).observe(rtf)
        self._child(self.transcriptions, model, label, outcome).inc()

    def count_worker_restart(self, model: str) -> None:
        self._child(self.worker_restarts, model).inc()

    def cache_hit_rates(self) -> dict[str, float]:
        """Per model, answers served partly from the prefix cache over answered requests."""
        return {m: self._hits.get(m, 0) / n for m, n in self._answered.items() if n}

    def render(self) -> bytes:
        """The text format of `/metrics` as served (runner/telemetry/exposition.py)."""
        return self.exposition.render()


class _CacheHitRate(Collector):
    """`quorum_cache_hit_rate{model}`: answers served partly from the prefix cache, over
    answered requests (the seed's "cache hit rate per model")."""

    def __init__(self, answered: dict[str, int], hits: dict[str, int]) -> None:
        self.answered = answered
        self.hits = hits

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "quorum_cache_hit_rate",
            "Share of answers that reused cached prompt tokens",
            labels=["model"],
        )
        for model, n in self.answered.items():
            family.add_metric([model], self.hits.get(model, 0) / n if n else 0.0)
        yield family


class _QueueDepth(Collector):
    def __init__(self, depths: Callable[[], dict[str, int]]) -> None:
        self.depths = depths

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "quorum_queue_depth",
            "Requests waiting in the runner's queue, by priority",
            labels=["priority"],
        )
        for priority, depth in self.depths().items():
            family.add_metric([priority], depth)
        yield family


class SchedulerMetrics:
    """The scheduler's observer: queue waits and refusals into Prometheus."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def on_queued(self, tenant: str, priority: str) -> None:
        return None

    def on_granted(self, tenant: str, priority: str, wait_s: float) -> None:
        self.metrics.observe_queue_wait(priority, wait_s)

    def on_rejected(self, reason: str, tenant: str) -> None:
        self.metrics.count_rejection(reason, tenant)
