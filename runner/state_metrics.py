"""Prometheus families read at scrape time from what the runner holds (no engine calls).

`quorum_health{status}`: the runner's health as `/health` answers it, one series per
status (1 for the current one, 0 for the others: a state set), read from the same
`Runtime.health()` that `/health`, readiness and capabilities' `health` read, so the four
never disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from runner.health import STATUSES

_TRIES = 3


def _read(read: Callable[[], str]) -> str:
    """`read()`; with METRICS_PORT the scrape runs on prometheus_client's own thread while
    the event loop changes the scheduler's tables, so a read that meets a dict resized
    under it is tried again."""
    for _ in range(_TRIES - 1):
        try:
            return read()
        except RuntimeError:
            continue
    return read()


class HealthCollector(Collector):
    """`quorum_health{status}` from `status()` (the `/health` body's `status`)."""

    def __init__(self, status: Callable[[], str]) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        current = _read(self.status)
        family = GaugeMetricFamily(
            "quorum_health",
            "The runner's health as /health answers it: 1 for the current status, else 0",
            labels=["status"],
        )
        for status in dict.fromkeys((*STATUSES, current)):
            family.add_metric([status], 1.0 if status == current else 0.0)
        yield family
