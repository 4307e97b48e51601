"""Prometheus families read at scrape time from what the runner holds (no engine calls).

`quorum_health{status}`: the runner's health as `/health` answers it, one series per
status (1 for the current one, 0 for the others: a state set), read from the same
`Runtime.health()` that `/health`, readiness and capabilities' `health` read, so the four
never disagree. `quorum_engine_queue_depth{model}` / `quorum_engine_requests_running{model}`:
the engines' own queues as `EngineWatch` last polled them. The scheduler's wait forecasts,
the same figures as capabilities' `queue.forecastWaitMs` (per priority: the longest over
the models) and `queue.forecastWaitMsByModel`, in seconds:
`quorum_queue_forecast_wait_seconds{priority}`,
`quorum_model_queue_forecast_wait_seconds{model, priority}`. They forecast the wait of a
new request of a new tenant (`runner/scheduler/forecast.py`); a model whose wait cannot be
forecast yet (nothing measured) has no series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from adapters.launched import EngineLoad
from runner.scheduler.stats import QueueStats
from runner.telemetry.health import STATUSES

_TRIES = 3
T = TypeVar("T")


def _read(read: Callable[[], T]) -> T:
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


class EngineQueueCollector(Collector):
    """`quorum_engine_queue_depth{model}` and `quorum_engine_requests_running{model}`: what
    the engines that report their own queue said at their last poll (runner/engines/watch.py:
    vLLM's `num_requests_waiting` / `num_requests_running`, ComfyUI's pending / running
    prompts, counted once per server under its first model). Engines that report nothing
    (llama-server, faster-whisper, attached `openai`) have no series."""

    def __init__(self, loads: Callable[[], Mapping[str, EngineLoad]]) -> None:
        self.loads = loads

    def collect(self) -> Iterator[Metric]:
        loads = _read(lambda: dict(self.loads()))
        waiting = GaugeMetricFamily(
            "quorum_engine_queue_depth",
            "Requests waiting inside the engine, as it last reported",
            labels=["model"],
        )
        running = GaugeMetricFamily(
            "quorum_engine_requests_running",
            "Requests the engine is executing, as it last reported",
            labels=["model"],
        )
        for model, load in sorted(loads.items()):
            waiting.add_metric([model], load.waiting)
            running.add_metric([model], load.running)
        yield waiting
        yield running


class ForecastGauges(Collector):
    """Both gauge families from one `QueueStats` snapshot per scrape."""

    def __init__(self, stats: Callable[[], QueueStats]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self.stats()
        overall = GaugeMetricFamily(
            "quorum_queue_forecast_wait_seconds",
            "Forecast queue wait of a new request, by priority (the longest over the models)",
            labels=["priority"],
        )
        for priority, ms in stats.forecast_wait_ms.items():
            overall.add_metric([priority], ms / 1000)
        yield overall
        per_model = GaugeMetricFamily(
            "quorum_model_queue_forecast_wait_seconds",
            "Forecast queue wait of a new request, by model and priority",
            labels=["model", "priority"],
        )
        for model, waits in sorted(stats.forecast_by_model.items()):
            for priority, ms in waits.items():
                per_model.add_metric([model, priority], ms / 1000)
        yield per_model
