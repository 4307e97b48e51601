"""runner/scheduler/retry_after.py: when a refused client should come back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.scheduler.retry_after import (
    HEADROOM,
    IDLE_INTERVAL_S,
    MAX_S,
    PromisedReturns,
    retry_after_s,
)

pytestmark = pytest.mark.timeout(30)


def test_retry_after_next_place_is_the_time_left() -> None:
    """One slot, 2 s per request, just granted: the next place opens in 2 s."""
    assert retry_after_s([(0.0, 2.0)], pending=0) == 2
    assert retry_after_s([(1.5, 2.0)], pending=0) == 1  # 0.5 s left, never 0


def test_retry_after_spreads_the_clients_due_back() -> None:
    """Each client due back before this one costs HEADROOM service intervals."""
    assert retry_after_s([(0.0, 2.0)], pending=1) == 2 + int(HEADROOM * 2)
    two_slots = [(0.0, 2.0), (1.0, 2.0)]  # a place opens every second
    assert retry_after_s(two_slots, pending=2) == 1 + int(2 * HEADROOM)


def test_retry_after_before_any_completion_is_not_the_queue_timeout() -> None:
    """With no service measured, a request's service is what it has run, at least 1 s."""
    assert retry_after_s([(0.3, None)], pending=0) == 1
    assert retry_after_s([(12.0, None)], pending=1) == 18  # overdue; interval 12 s x 1.5


def test_retry_after_nothing_in_flight() -> None:
    """A model loading (nothing in flight): places assumed one IDLE_INTERVAL_S apart."""
    assert retry_after_s([], pending=0) == 1
    assert retry_after_s([], pending=4) == int(4 * HEADROOM * IDLE_INTERVAL_S)


def test_promised_returns_count_until_they_pass() -> None:
    """A promised return counts as pending until its time comes."""
    returns = PromisedReturns()
    returns.promise(5.0)
    returns.promise(3.0)
    assert returns.pending(2.0) == 2
    assert returns.pending(3.0) == 1
    assert returns.pending(5.0) == 0


_RUNNING = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=600.0),
        st.one_of(st.none(), st.floats(min_value=0.01, max_value=600.0)),
    ),
    max_size=8,
)


@given(running=_RUNNING, extra=_RUNNING, pending=st.integers(min_value=0, max_value=10_000))
def test_retry_after_bounded_and_monotone(
    running: list[tuple[float, float | None]],
    extra: list[tuple[float, float | None]],
    pending: int,
) -> None:
    """Always 1..3600 s; a client with more clients due back before it never returns
    earlier; more requests in flight (more places opening) never send it back later."""
    now = retry_after_s(running, pending)
    assert 1 <= now <= MAX_S
    assert retry_after_s(running, pending + 1) >= now
    if running:
        assert retry_after_s(running + extra, pending) <= now
