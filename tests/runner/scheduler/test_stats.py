"""Queue measurements (runner/scheduler/stats.py)."""

from __future__ import annotations

from runner.scheduler.stats import MAX_SAMPLES, WaitWindow


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
