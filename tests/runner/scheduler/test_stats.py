"""Queue measurements (runner/scheduler/stats.py)."""

from __future__ import annotations

import math

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


def test_wait_window_counts_zero_waits_as_any_other() -> None:
    """Waits of zero (granted at once) are counted apart, yet the average and the
    nearest-rank p95 equal those of every wait in the window sorted, through expiry
    and the cap."""
    window = WaitWindow(10.0)
    kept: list[tuple[float, float]] = []
    waits = [0.0, 0.0, 0.3, 0.0, 0.05, 0.0, 0.0, 1.2, 0.0, 0.0, 0.0, 0.7]
    for i in range(MAX_SAMPLES + 500):
        at, wait = i / 200, waits[i % len(waits)] * (1 + i % 7)
        window.record(at, wait)
        kept = [*kept[-(MAX_SAMPLES - 1) :], (at, wait)]
        if i % 97 == 0:
            live = sorted(w for a, w in kept if at - a <= 10.0)
            expected_p95 = round(1000 * live[math.ceil(0.95 * len(live)) - 1])
            assert window.p95_ms(at) == expected_p95
            assert window.avg_ms(at) == round(1000 * sum(live) / len(live))
    assert window.avg_ms(1000.0) == 0 and window.p95_ms(1000.0) == 0
