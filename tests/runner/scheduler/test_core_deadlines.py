"""Deadlines in the scheduler core: refused on arrival when unreachable, dropped when due."""

from __future__ import annotations

import pytest

from runner.scheduler.config import SchedulerConfig
from runner.scheduler.errors import DeadlinePassed, DeadlineUnreachable
from tests.runner.scheduler.fakes import Driver

pytestmark = pytest.mark.timeout(10)


def busy_one_slot(service_s: float = 2.0) -> tuple[Driver, int]:
    """One slot whose service time is measured at `service_s`, busy with a request just granted."""
    d = Driver(SchedulerConfig(default_concurrency=1, queue_timeout_s=None, low_aging_s=None))
    first = d.arrive("warm")
    d.now += service_s
    d.done(first)
    busy = d.arrive("busy")
    return d, busy


def test_scheduler_unreachable_deadline_refused_in_the_same_call() -> None:
    """Behind one 2 s request in flight and one waiting, a 1 s deadline is refused on arrival
    with the 4 s forecast, its deadline and a Retry-After of the 3 s excess."""
    d, _busy = busy_one_slot()
    d.arrive("queued")
    late = d.arrive("hurried", deadline_ms=1000)
    error = d.effects.rejection(late)  # refused inside the arrival event itself
    assert isinstance(error, DeadlineUnreachable)
    assert (error.status, error.code) == (503, "deadline_unreachable")
    assert error.extra == {"forecastWaitMs": 4000, "deadlineMs": 1000}
    assert error.headers["Retry-After"] == "3"
    assert not d.core.is_waiting(late)


def test_scheduler_reachable_deadline_waits() -> None:
    """A deadline longer than the forecast wait is admitted to the queue."""
    d, _busy = busy_one_slot()
    ticket = d.arrive("patient", deadline_ms=2500)
    assert d.core.is_waiting(ticket)
    assert d.effects.rejected == []


def test_scheduler_granted_at_once_ignores_the_deadline() -> None:
    """A request that finds a free slot waits for nothing: any deadline is met."""
    d = Driver(SchedulerConfig(default_concurrency=1))
    ticket = d.arrive(deadline_ms=1)
    assert d.effects.granted_ids == [ticket]


def test_scheduler_queued_request_whose_deadline_passes_never_reaches_the_engine() -> None:
    """A waiter whose deadline comes leaves the queue then with 504 deadline_exceeded; the slot
    freed later goes to the next waiter, never to it."""
    d, busy = busy_one_slot()
    doomed = d.arrive("doomed", deadline_ms=2500)
    after = d.arrive("after")
    d.tick(2.4)
    assert d.core.is_waiting(doomed)
    d.tick(0.1)  # its deadline
    error = d.effects.rejection(doomed)
    assert isinstance(error, DeadlinePassed)
    assert (error.status, error.code) == (504, "deadline_exceeded")
    assert error.extra == {"queueWaitMs": 2500, "deadlineMs": 2500}
    assert "Retry-After" not in error.headers
    assert not d.core.is_waiting(doomed)
    d.done(busy)
    assert doomed not in d.effects.granted_ids
    assert d.effects.granted_ids[-1] == after


def test_scheduler_deadline_due_as_the_slot_frees_is_dropped_first() -> None:
    """A slot that frees at the very moment a waiter's deadline passes does not go to it."""
    d, busy = busy_one_slot()
    doomed = d.arrive("doomed", deadline_ms=2000)
    d.now += 2.0
    d.done(busy)
    assert isinstance(d.effects.rejection(doomed), DeadlinePassed)
    assert doomed not in d.effects.granted_ids


def test_scheduler_without_a_measured_service_time_admits() -> None:
    """Before any request finished, the wait cannot be forecast: a deadline is not refused on
    arrival (it still bounds the wait)."""
    d = Driver(SchedulerConfig(default_concurrency=1))
    d.arrive()
    ticket = d.arrive(deadline_ms=1)
    assert d.core.is_waiting(ticket)
    d.tick(0.001)
    assert isinstance(d.effects.rejection(ticket), DeadlinePassed)
