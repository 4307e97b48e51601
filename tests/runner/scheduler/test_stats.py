"""Queue measurements (runner/scheduler/stats.py)."""

from __future__ import annotations

from runner.scheduler.stats import MAX_SAMPLES, DrainMeter, WaitWindow


def test_drain_meter_measures_rates_above_the_sample_cap() -> None:
    """200 completions/s over a full 60 s window measure as 200/s (no cap at 4096/60)."""
    meter = DrainMeter(60.0, started_at=0.0)
    for i in range(200 * 60):
        meter.record(i / 200)
    assert 195 <= meter.rate(60.0) <= 205


def test_drain_meter_forgets_completions_outside_the_window() -> None:
    """Completions older than the window no longer count."""
    meter = DrainMeter(10.0, started_at=0.0)
    for i in range(100):
        meter.record(i / 10)  # 10/s for 10 s
    assert meter.rate(10.0) == 10.0
    assert meter.rate(30.0) == 0.0


def test_wait_window_average_follows_expiry_and_cap() -> None:
    """The running average drops expired samples and keeps only the newest MAX_SAMPLES."""
    window = WaitWindow(60.0)
    window.record(0.0, 1.0)
    for i in range(MAX_SAMPLES):
        window.record(1.0 + i / 1000, 0.1)
    assert window.avg_ms(5.0) == 100  # the 1 s sample fell out by the cap
    assert window.avg_ms(100.0) == 0  # everything expired
    window.record(100.0, 0.25)
    assert window.avg_ms(100.0) == 250 and window.p95_ms(100.0) == 250
