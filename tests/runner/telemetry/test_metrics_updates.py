"""The request path's metric updates (runner/telemetry/metrics.py, on the series of
runner/telemetry/series.py) write what prometheus_client's own `Counter`, `Gauge` and
`Histogram` write for the same requests, and refuse what they refuse."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from runner.telemetry.exposition import Exposition
from runner.telemetry.metrics import _DURATION_BUCKETS, Metrics

pytestmark = pytest.mark.timeout(30)

FAMILIES = (
    "quorum_requests_total",
    "quorum_requests_in_flight",
    "quorum_inference_duration_seconds",
    "quorum_queue_wait_seconds",
    "quorum_tenant_tokens_total",
)


def _lines(text: str) -> list[str]:
    """The lines of the request path's families, less the `_created` samples."""
    return [
        line
        for line in text.splitlines()
        if any(f in line for f in FAMILIES) and "_created" not in line
    ]


def test_metrics_request_updates_match_prometheus_client() -> None:
    """Counts, in-flight gauges, durations, queue waits and tokens read the same as the
    same updates on prometheus_client's series."""
    ours = Metrics()
    ours.declare_tenants(["acme"])
    for _ in range(3):
        ours.count_request("m", "acme", 200)
        ours.begin_request("m")
        ours.observe_queue_wait("normal", 0.0)
    ours.count_request("m", "stranger", 429)
    ours.end_request("m", 0.5)
    ours.observe_queue_wait("high", 0.02)
    ours.count_tokens("acme", "m", 12, 0)
    ours.count_tokens("acme", "m", 5, 7)

    r = CollectorRegistry()
    requests = Counter("quorum_requests_total", "x", ["model", "tenant", "status"], registry=r)
    in_flight = Gauge("quorum_requests_in_flight", "x", ["model"], registry=r)
    duration = Histogram(
        "quorum_inference_duration_seconds", "x", ["model"], buckets=_DURATION_BUCKETS, registry=r
    )
    wait = Histogram(
        "quorum_queue_wait_seconds", "x", ["priority"], buckets=_DURATION_BUCKETS, registry=r
    )
    tokens = Counter("quorum_tenant_tokens_total", "x", ["tenant", "model", "kind"], registry=r)
    requests.labels("m", "acme", "200").inc(3)
    in_flight.labels("m").inc(3)
    wait.labels("normal").observe(0.0)
    wait.labels("normal").observe(0.0)
    wait.labels("normal").observe(0.0)
    requests.labels("m", "_other", "429").inc()
    in_flight.labels("m").dec()
    duration.labels("m").observe(0.5)
    wait.labels("high").observe(0.02)
    tokens.labels("acme", "m", "input").inc(17)
    tokens.labels("acme", "m", "output").inc(7)

    def samples(text: str) -> list[str]:  # families in registration order: compare sorted
        return sorted(line for line in _lines(text) if not line.startswith("#"))

    assert samples(Exposition(ours.registry).render().decode()) == samples(
        generate_latest(r).decode()
    )


def test_metrics_negative_tokens_still_refused() -> None:
    """A negative token count is refused as prometheus_client's counter refuses it."""
    metrics = Metrics()
    with pytest.raises(ValueError, match="non-negative"):
        metrics.count_tokens("default", "m", -1, 0)
