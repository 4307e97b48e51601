"""`should_write`: which progress reports reach the store."""

from __future__ import annotations

from runner.jobs.progress import Throttle, should_write
from runner.jobs.record import Progress

T = Throttle(min_interval_s=0.5, min_step=0.05)


def test_progress_first_report_is_written() -> None:
    """With nothing written yet, the first report is written."""
    assert should_write(None, None, Progress(0.1, 100.0), 0.0, T)


def test_progress_unchanged_is_skipped_even_late() -> None:
    """The same progress again is not written, however long after."""
    p = Progress(10.0, 100.0)
    assert not should_write(p, 0.0, Progress(10.0, 100.0), 60.0, T)


def test_progress_small_step_waits_for_the_interval() -> None:
    """A 1% move is skipped before min_interval_s and written at it."""
    last = Progress(10.0, 100.0)
    assert not should_write(last, 0.0, Progress(11.0, 100.0), 0.49, T)
    assert should_write(last, 0.0, Progress(11.0, 100.0), 0.5, T)


def test_progress_five_percent_step_is_written_at_once() -> None:
    """A move of min_step (here 0.01 -> 0.06, inexact in floating point) is written at once."""
    assert should_write(Progress(1.0, 100.0), 0.0, Progress(6.0, 100.0), 0.0, T)
    assert not should_write(Progress(1.0, 100.0), 0.0, Progress(5.9, 100.0), 0.0, T)


def test_progress_completion_is_written_at_once() -> None:
    """Reaching the total is written without waiting."""
    assert should_write(Progress(99.0, 100.0), 0.0, Progress(100.0, 100.0), 0.0, T)


def test_progress_total_appearing_is_written() -> None:
    """When a total becomes known the change is written at once."""
    assert should_write(Progress(3.0), 0.0, Progress(3.0, 60.0), 0.0, T)


def test_progress_without_total_follows_the_interval() -> None:
    """With no total, only the interval decides."""
    assert not should_write(Progress(3.0), 0.0, Progress(300.0), 0.1, T)
    assert should_write(Progress(3.0), 0.0, Progress(300.0), 0.5, T)


def test_progress_write_count_is_bounded() -> None:
    """A job reporting 1000 tiny steps at one instant is written at most 1/min_step + 2 times."""
    last: Progress | None = None
    last_at: float | None = None
    writes = 0
    for i in range(1, 1001):
        new = Progress(i / 10, 100.0)
        if should_write(last, last_at, new, 0.0, T):
            writes, last, last_at = writes + 1, new, 0.0
    assert writes <= 22
    assert last == Progress(100.0, 100.0)
