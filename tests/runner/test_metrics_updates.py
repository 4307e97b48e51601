"""The request path's metric updates (runner/telemetry/metrics.py, `Metrics._adder`) write
what prometheus_client's own `inc`/`dec` write, and refuse what it refuses."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from runner.telemetry.metrics import Metrics

pytestmark = pytest.mark.timeout(30)


def _text(metrics: Metrics) -> list[str]:
    """The registry's text format, less the `_created` samples (a clock reading)."""
    text = generate_latest(metrics.registry).decode()
    return [line for line in text.splitlines() if "_created" not in line]


def test_metrics_request_updates_match_prometheus_client() -> None:
    """Counts, in-flight gauges and tokens read the same as through `labels().inc()`."""
    fast, slow = Metrics(), Metrics()
    for m in (fast, slow):
        m.declare_tenants(["acme"])
    for _ in range(3):
        fast.count_request("m", "acme", 200)
        fast.begin_request("m")
    fast.count_request("m", "stranger", 429)
    fast.end_request("m", 0.5)
    fast.count_tokens("acme", "m", 12, 0)
    fast.count_tokens("acme", "m", 5, 7)
    slow.requests.labels("m", "acme", "200").inc(3)
    slow.requests.labels("m", "_other", "429").inc()
    slow.in_flight.labels("m").inc(3)
    slow.in_flight.labels("m").dec()
    slow.duration.labels("m").observe(0.5)
    slow.tokens.labels("acme", "m", "input").inc(17)
    slow.tokens.labels("acme", "m", "output").inc(7)
    slow._answered["m"] = 3
    assert _text(fast) == _text(slow)


def test_metrics_negative_tokens_still_refused() -> None:
    """A negative token count is refused as prometheus_client's counter refuses it."""
    metrics = Metrics()
    with pytest.raises(ValueError, match="non-negative"):
        metrics.count_tokens("default", "m", -1, 0)
