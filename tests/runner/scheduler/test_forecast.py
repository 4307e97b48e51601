"""The wait forecast (`forecast.py`, `deadlines.opens_in_s`): pure, and its properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.scheduler.config import ModelPolicy
from runner.scheduler.deadlines import opens_in_s
from runner.scheduler.forecast import MAX_HIGHER_SHARE, TenantQueue, ahead, forecast_wait_s
from runner.scheduler.models import ModelRecord, ModelState

pytestmark = pytest.mark.timeout(60)

seconds = st.floats(min_value=0.0, max_value=600.0, allow_nan=False)
service_st = st.floats(min_value=0.01, max_value=60.0, allow_nan=False)
slots_st = st.integers(min_value=1, max_value=16)
left_st = st.lists(st.floats(min_value=-60.0, max_value=600.0, allow_nan=False), max_size=20)
ahead_st = st.lists(service_st, max_size=60)
share_st = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@given(ahead_st, service_st, slots_st, left_st, seconds, share_st)
def test_forecast_is_monotone_in_queue_position(
    ahead_s: list[float], extra: float, slots: int, left: list[float], opens: float, share: float
) -> None:
    """One more request ahead never shortens the forecast wait."""
    now = forecast_wait_s(ahead_s, slots, left, opens, share)
    assert forecast_wait_s([*ahead_s, extra], slots, left, opens, share) >= now - 1e-9


@given(st.integers(min_value=0, max_value=60), service_st, slots_st, left_st, seconds, share_st)
def test_forecast_never_below_the_measured_service_time(
    n: int, service: float, slots: int, left: list[float], opens: float, share: float
) -> None:
    """Behind a whole round of requests (`slots` or more ahead, each of the measured
    service time), the wait is at least one service time, after the model opens."""
    wait = forecast_wait_s([service] * n, slots, left, opens, share)
    if n >= slots:
        assert wait >= opens + service - 1e-9


@given(ahead_st, slots_st, left_st, seconds, share_st)
def test_forecast_never_beats_the_model_opening(
    ahead_s: list[float], slots: int, left: list[float], opens: float, share: float
) -> None:
    """Nothing is served before a loading model is ready: the forecast is at least its eta."""
    assert forecast_wait_s(ahead_s, slots, left, opens, share) >= opens


def test_forecast_round_robin_over_slots_with_equal_services() -> None:
    """Two slots, one request with 3 s left: the queue takes the free slot, then the one
    freeing in 3 s, then each again 4 s later."""
    waits = [forecast_wait_s([4.0] * k, 2, [3.0]) for k in range(4)]
    assert waits == [0.0, 3.0, 4.0, 7.0]


def test_forecast_stretches_by_the_share_of_more_important_bands() -> None:
    """Bands above taking half the engine double the wait after the opening (at most
    MAX_HIGHER_SHARE is assumed)."""
    assert forecast_wait_s([2.0], 1, [1.0], 0.5, higher_share=0.5) == 0.5 + 2 * 2.5
    assert forecast_wait_s([], 1, [1.0], higher_share=1.0) == 1.0 / (1 - MAX_HIGHER_SHARE)


def test_forecast_more_in_flight_than_slots_waits_for_the_excess() -> None:
    """Concurrency shrank to 1 with two in flight: the slot is the one freed last."""
    assert forecast_wait_s([], 1, [3.0, 1.0]) == 3.0


tickets_st = st.lists(st.integers(min_value=1, max_value=2000), max_size=10)
queues_st = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d"]),
    st.tuples(
        st.floats(min_value=0, max_value=1e4, allow_nan=False),
        st.sampled_from([0.5, 1.0, 2.0]),
        tickets_st,
    ),
    max_size=4,
)


def _band(queues: dict[str, tuple[float, float, list[int]]]) -> dict[str, TenantQueue]:
    """Tenant queues whose ticket ids interleave the tenants (a request added at the back
    leaves the others' ids as they were)."""
    return {
        name: TenantQueue(
            counter, weight, [(10 * i + "abcd".index(name), cost) for i, cost in enumerate(costs)]
        )
        for name, (counter, weight, costs) in queues.items()
    }


@given(
    st.lists(st.integers(min_value=1, max_value=2000), max_size=20),
    queues_st,
    st.sampled_from(["a", "b", "c", "d", "new"]),
    st.sampled_from(["a", "b", "c", "d"]),
    st.integers(min_value=1, max_value=2000),
    st.booleans(),
)
def test_ahead_grows_when_another_request_queues(
    higher: list[int],
    queues: dict[str, tuple[float, float, list[int]]],
    tenant: str,
    other: str,
    cost: int,
    fair: bool,
) -> None:
    """A request added to the band (another tenant's, or the same tenant's) never moves a
    new request forward; everything of the bands above and its own tenant's goes first."""
    band = _band(queues)
    before = ahead(higher, tenant, band, fair=fair)
    counter, weight, costs = queues.get(other, (0.0, 1.0, []))
    band_after = _band({**queues, other: (counter, weight, [*costs, cost])})
    assert len(ahead(higher, tenant, band_after, fair=fair)) >= len(before)
    own = len(band[tenant].tickets) if tenant in band else 0
    assert len(before) >= len(higher) + own
    assert before[: len(higher)] == higher


def test_ahead_fcfs_counts_everyone_in_the_band_by_arrival() -> None:
    """Without fair sharing a new request goes behind every request already in its band."""
    band = {
        "b": TenantQueue(0.0, 1.0, [(1, 10), (4, 40)]),
        "c": TenantQueue(99.0, 1.0, [(2, 20)]),
        "a": TenantQueue(50.0, 1.0, [(3, 30)]),
    }
    assert ahead([7, 7], "a", band, fair=False) == [7, 7, 10, 20, 30, 40]


def test_ahead_fair_share_replays_vtc() -> None:
    """Under VTC a tenant served far more than this one waits behind it; one served less
    goes first until its counter passes this one's (which its own queue raises)."""
    band = {
        "heavy": TenantQueue(500.0, 1.0, [(1, 10)] * 5),
        "light": TenantQueue(0.0, 1.0, [(2, 30), (5, 30), (6, 30)]),
        "me": TenantQueue(0.0, 1.0, [(3, 20)]),
    }
    # light 0 (older head) -> 30; me 0 -> 20; me's new request at 20 before light at 30
    assert ahead([], "me", band, fair=True) == [30, 20]


def test_opens_in_counts_a_load_in_progress() -> None:
    """A loading model opens when its last load time has passed since the load began; a
    failed one after its restart plus a load; a ready one now."""
    record = ModelRecord(ModelPolicy(100), ModelState.LOADING, since=10.0, load_s=8.0)
    assert opens_in_s(record, False, 13.0) == 5.0
    record = ModelRecord(ModelPolicy(100), ModelState.FAILED, load_s=8.0, restart_at=20.0)
    assert opens_in_s(record, False, 18.0) == 10.0
    assert opens_in_s(ModelRecord(ModelPolicy(100), ModelState.READY), False, 5.0) == 0.0
