"""The wait forecast (`forecast.py`, `deadlines.opens_in_s`): pure, and its properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.scheduler.config import ModelPolicy
from runner.scheduler.deadlines import opens_in_s
from runner.scheduler.forecast import TenantQueue, forecast_wait_s, position
from runner.scheduler.models import ModelRecord, ModelState

pytestmark = pytest.mark.timeout(60)

seconds = st.floats(min_value=0.0, max_value=600.0, allow_nan=False)
slots_st = st.integers(min_value=1, max_value=16)
running_st = st.lists(seconds, max_size=20)
ahead_st = st.integers(min_value=0, max_value=500)


@given(ahead_st, slots_st, running_st, seconds, seconds)
def test_forecast_is_monotone_in_queue_position(
    ahead: int, slots: int, running: list[float], service: float, opens: float
) -> None:
    """One more request ahead never shortens the forecast wait."""
    now = forecast_wait_s(ahead, slots, running, service, opens)
    later = forecast_wait_s(ahead + 1, slots, running, service, opens)
    assert now is not None and later is not None
    assert later >= now


@given(ahead_st, slots_st, running_st, seconds, seconds)
def test_forecast_never_below_the_measured_service_time(
    ahead: int, slots: int, running: list[float], service: float, opens: float
) -> None:
    """Behind a whole round of requests (`slots` or more ahead), the forecast is at least the
    measured service time per round, after the model opens."""
    wait = forecast_wait_s(ahead, slots, running, service, opens)
    assert wait is not None
    assert wait >= (ahead // slots) * service + opens - 1e-9
    if ahead >= slots:
        assert wait >= service


@given(ahead_st, slots_st, running_st, seconds, seconds)
def test_forecast_never_beats_the_model_opening(
    ahead: int, slots: int, running: list[float], service: float, opens: float
) -> None:
    """Nothing is served before a loading model is ready: the forecast is at least its eta."""
    wait = forecast_wait_s(ahead, slots, running, service, opens)
    assert wait is not None and wait >= opens


def test_forecast_round_robin_over_slots() -> None:
    """Two slots, one request 1 s into a 4 s service: the queue takes the free slot, then
    the one freeing in 3 s, then each again 4 s later."""
    waits = [forecast_wait_s(k, 2, [1.0], 4.0) for k in range(4)]
    assert waits == [0.0, 3.0, 4.0, 7.0]


def test_forecast_unknown_without_a_service_time() -> None:
    """With nothing measured, only a free slot (and the model's eta) can be forecast."""
    assert forecast_wait_s(0, 2, [5.0], None, 1.5) == 1.5
    assert forecast_wait_s(1, 2, [5.0], None) is None


def test_forecast_more_in_flight_than_slots_waits_for_the_excess() -> None:
    """Concurrency shrank to 1 with two in flight: the slot is the one freed last."""
    assert forecast_wait_s(0, 1, [3.0, 1.0], 4.0) == 3.0


queues_st = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d"]),
    st.builds(
        TenantQueue,
        st.floats(min_value=0, max_value=1e4, allow_nan=False),
        st.sampled_from([0.5, 1.0, 2.0]),
        st.lists(st.integers(min_value=1, max_value=2000), max_size=10),
    ),
    max_size=4,
)


@given(
    st.integers(min_value=0, max_value=50),
    st.lists(st.integers(min_value=1, max_value=2000), max_size=10),
    st.floats(min_value=0, max_value=1e4, allow_nan=False),
    queues_st,
    st.sampled_from(["a", "b", "c", "d"]),
    st.integers(min_value=1, max_value=2000),
    st.booleans(),
)
def test_position_grows_when_another_tenant_queues_more(
    higher: int,
    own: list[int],
    counter: float,
    others: dict[str, TenantQueue],
    tenant: str,
    cost: int,
    fair: bool,
) -> None:
    """A request added to another tenant's queue never moves a new request forward, and the
    position never counts fewer than the higher bands and the tenant's own queue."""
    before = position(higher, own, counter, 1.0, others, fair=fair)
    queue = others.get(tenant, TenantQueue(counter, 1.0, []))
    grown = {**others, tenant: TenantQueue(queue.counter, queue.weight, [*queue.costs, cost])}
    assert position(higher, own, counter, 1.0, grown, fair=fair) >= before
    assert before >= higher + len(own)


def test_position_fcfs_counts_everyone_in_the_band() -> None:
    """Without fair sharing a new request goes behind every request already in its band."""
    others = {"b": TenantQueue(0.0, 1.0, [10, 10]), "c": TenantQueue(99.0, 1.0, [10])}
    assert position(2, [10], 50.0, 1.0, others, fair=False) == 2 + 1 + 3


def test_position_fair_share_skips_tenants_served_more() -> None:
    """Under VTC a tenant served far more than this one waits behind it; a tenant served
    less goes first until its counter passes this one's."""
    others = {"heavy": TenantQueue(500.0, 1.0, [10] * 5), "light": TenantQueue(0.0, 1.0, [30] * 5)}
    # target 20 (own queue of one, cost 20): light is served at 0, 30 (> 20: stops) -> 1
    assert position(0, [20], 0.0, 1.0, others, fair=True) == 1 + 1


def test_opens_in_counts_a_load_in_progress() -> None:
    """A loading model opens when its last load time has passed since the load began; a
    failed one after its restart plus a load; a ready one now."""
    record = ModelRecord(ModelPolicy(100), ModelState.LOADING, since=10.0, load_s=8.0)
    assert opens_in_s(record, False, 13.0) == 5.0
    record = ModelRecord(ModelPolicy(100), ModelState.FAILED, load_s=8.0, restart_at=20.0)
    assert opens_in_s(record, False, 18.0) == 10.0
    assert opens_in_s(ModelRecord(ModelPolicy(100), ModelState.READY), False, 5.0) == 0.0
