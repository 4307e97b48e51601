"""The published forecasts: capabilities' `queue.forecastWaitMs` and the gauges."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from runner.scheduler.stats import QueueStats
from runner.telemetry.state_metrics import ForecastGauges
from tests.runner.scheduler.test_core_deadlines import busy_one_slot

pytestmark = pytest.mark.timeout(10)


def test_scheduler_stats_forecast_per_priority_and_model() -> None:
    """With a 2 s slot busy and two normal requests of one tenant waiting, a new tenant's high
    request waits for the slot, a normal one also for one of them (fair share), a low one
    for both, stretched by the share normal requests took of the last 30 s (4 s)."""
    d, _busy = busy_one_slot()
    d.arrive("t")
    d.arrive("t")
    forecast = {"high": 2000, "normal": 4000, "low": round(6000 / (1 - 4 / 30))}
    stats = d.core.stats(d.now)
    assert stats.forecast_by_model == {"m": forecast}
    assert stats.capabilities()["forecastWaitMs"] == forecast
    assert stats.capabilities()["forecastWaitMsByModel"] == {"m": forecast}


def test_stats_forecast_per_priority_is_the_longest_over_models() -> None:
    """`forecastWaitMs` takes, per priority, the longest wait any model forecasts."""
    stats = QueueStats(
        0, 16, {}, 0, 0, {},
        forecast_by_model={
            "a": {"high": 100, "normal": 900, "low": 900},
            "b": {"high": 300, "normal": 300, "low": 2000},
        },
    )  # fmt: skip
    assert stats.forecast_wait_ms == {"high": 300, "normal": 900, "low": 2000}


def test_forecast_gauges_report_the_snapshot_in_seconds() -> None:
    """Both gauge families carry the snapshot's figures, in seconds, at scrape time."""
    stats = QueueStats(
        0, 16, {}, 0, 0, {}, forecast_by_model={"m": {"high": 0, "normal": 1500, "low": 4000}}
    )
    registry = CollectorRegistry()
    registry.register(ForecastGauges(lambda: stats))
    text = generate_latest(registry).decode()
    assert 'quorum_queue_forecast_wait_seconds{priority="normal"} 1.5' in text
    assert 'quorum_model_queue_forecast_wait_seconds{model="m",priority="low"} 4.0' in text
