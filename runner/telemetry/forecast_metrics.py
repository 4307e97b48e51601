"""The scheduler's wait forecasts as Prometheus gauges, read at scrape time.

The same figures as capabilities' `queue.forecastWaitMs` (per priority: the longest over
the models) and `queue.forecastWaitMsByModel`, in seconds:

- `quorum_queue_forecast_wait_seconds{priority}`
- `quorum_model_queue_forecast_wait_seconds{model, priority}`

They forecast the wait of a new request of a new tenant (`runner/scheduler/forecast.py`);
a model whose wait cannot be forecast yet (nothing measured) has no series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from runner.scheduler.stats import QueueStats


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
