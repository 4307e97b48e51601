"""The eviction policy (runner/scheduler/eviction.py): a pure function of its inputs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runner.scheduler.eviction import (
    Evict,
    Fits,
    Impossible,
    Incoming,
    Resident,
    Wait,
    plan,
)
from runner.scheduler.models import ModelState


def ready(model: str, mem: int, **kwargs: object) -> Resident:
    return Resident(model, ModelState.READY, mem, **kwargs)  # type: ignore[arg-type]


def test_eviction_fits_in_free_memory() -> None:
    """A model that fits in the free memory evicts nothing."""
    assert plan(Incoming("c", 4000), [ready("a", 8000)], 5000) == Fits(5000)


def test_eviction_least_recently_used_goes_first() -> None:
    """Among equal models the least recently used is the victim."""
    residents = [ready("a", 8000, last_used=5.0), ready("b", 8000, last_used=1.0)]
    assert plan(Incoming("c", 8000), residents, 0) == Evict(("b",), 8000, 8000)


def test_eviction_lower_priority_before_recency() -> None:
    """A lower-priority model goes before a less recently used higher-priority one."""
    residents = [
        ready("old", 8000, priority=5, last_used=1.0),
        ready("cheap", 8000, priority=0, last_used=9.0),
    ]
    assert plan(Incoming("c", 8000), residents, 0).victims == ("cheap",)  # type: ignore[union-attr]


def test_eviction_idle_before_busy() -> None:
    """An idle model goes before a busy one of the same priority, whatever their recency."""
    residents = [
        ready("busy", 8000, last_used=1.0, in_flight=2),
        ready("queued", 8000, last_used=2.0, waiting=1),
        ready("idle", 8000, last_used=9.0),
    ]
    assert plan(Incoming("c", 8000), residents, 0).victims == ("idle",)  # type: ignore[union-attr]


def test_eviction_never_a_pinned_model() -> None:
    """A pinned model is never a victim, even the least recently used."""
    residents = [ready("pin", 8000, pinned=True, last_used=0.0), ready("b", 8000, last_used=9.0)]
    assert plan(Incoming("c", 8000), residents, 0) == Evict(("b",), 8000, 8000)


def test_eviction_impossible_names_the_memory() -> None:
    """When even evicting every evictable model is not enough, the reason says what is where."""
    residents = [ready("pin", 10000, pinned=True), ready("b", 6000)]
    decision = plan(Incoming("big", 12000), residents, 4000)
    assert isinstance(decision, Impossible)
    assert decision.reason == (
        "needs 12000 MB; 4000 MB free, 6000 MB evictable, 10000 MB pinned, "
        "0 MB loading, 0 MB being freed"
    )


def test_eviction_evict_first_is_honoured() -> None:
    """`evict_first` is evicted first, before the least recently used model."""
    residents = [ready("lru", 8000, last_used=0.0), ready("asked", 8000, last_used=9.0)]
    assert plan(Incoming("c", 8000), residents, 0, "asked").victims == ("asked",)  # type: ignore[union-attr]


def test_eviction_evict_first_goes_even_when_the_target_fits() -> None:
    """The caller asked for `evict_first` to be unloaded first: it goes though there is room."""
    assert plan(Incoming("c", 1000), [ready("x", 8000)], 9000, "x") == Evict(("x",), 0, 8000)


def test_eviction_evict_first_pinned_is_ignored() -> None:
    """A pinned `evict_first` stays; the policy picks another victim."""
    residents = [ready("pin", 8000, pinned=True), ready("b", 8000)]
    assert plan(Incoming("c", 8000), residents, 0, "pin").victims == ("b",)  # type: ignore[union-attr]


def test_eviction_loading_model_is_never_a_victim() -> None:
    """Memory held by a model still loading is waited for, never evicted."""
    residents = [Resident("l", ModelState.LOADING, 8000), ready("b", 2000)]
    assert isinstance(plan(Incoming("c", 8000), residents, 0), Wait)


def test_eviction_waits_while_another_model_loads() -> None:
    """No victims are chosen while a load is in progress, even if the ready ones would do."""
    residents = [Resident("l", ModelState.LOADING, 2000), ready("b", 8000)]
    decision = plan(Incoming("c", 8000), residents, 0)
    assert decision == Wait("8000 MB short; evicting once l has loaded")


def test_eviction_waits_for_memory_already_leaving() -> None:
    """A model draining or stopping frees its memory soon: wait rather than evict more."""
    residents = [Resident("d", ModelState.DRAINING, 8000), ready("b", 8000)]
    assert isinstance(plan(Incoming("c", 8000), residents, 0), Wait)


def test_eviction_keeps_victims_the_later_ones_made_unnecessary() -> None:
    """A small early victim is spared when a larger later one covers the shortfall alone."""
    residents = [ready("small", 2000, last_used=0.0), ready("big", 10000, last_used=1.0)]
    assert plan(Incoming("c", 9000), residents, 0) == Evict(("big",), 9000, 10000)


def test_eviction_takes_several_victims_when_needed() -> None:
    """Victims are added in order until the shortfall is covered."""
    residents = [ready(m, 3000, last_used=float(i)) for i, m in enumerate("abcd")]
    assert plan(Incoming("x", 8000), residents, 1000).victims == ("a", "b", "c")  # type: ignore[union-attr]


residents_strategy = st.lists(
    st.builds(
        Resident,
        model=st.sampled_from([f"m{i}" for i in range(8)]),
        state=st.sampled_from([s for s in ModelState if s.holds_memory]),
        mem_mb=st.integers(0, 20000),
        pinned=st.booleans(),
        priority=st.integers(0, 3),
        last_used=st.floats(0, 100),
        in_flight=st.integers(0, 3),
        waiting=st.integers(0, 3),
    ),
    max_size=8,
    unique_by=lambda r: r.model,
)


@given(
    residents=residents_strategy,
    need=st.integers(0, 40000),
    free=st.integers(0, 20000),
    first=st.none() | st.sampled_from([f"m{i}" for i in range(8)]),
)
def test_eviction_victims_are_ready_unpinned_and_enough(
    residents: list[Resident], need: int, free: int, first: str | None
) -> None:
    """Any eviction names only ready, unpinned models, and with what leaves they cover the need."""
    decision = plan(Incoming("target", need), residents, free, first)
    if isinstance(decision, Evict):
        by_name = {r.model: r for r in residents}
        victims = [by_name[v] for v in decision.victims]
        assert all(v.state in (ModelState.READY, ModelState.SLEEPING) for v in victims)
        assert not any(v.pinned for v in victims)
        assert len(set(decision.victims)) == len(victims)
        leaving = sum(
            r.mem_mb for r in residents if r.state in (ModelState.DRAINING, ModelState.STOPPING)
        )
        assert free + leaving + sum(v.mem_mb for v in victims) >= need
    elif isinstance(decision, Fits):
        assert need <= free
