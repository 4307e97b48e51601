"""VTC bookkeeping: service counters, weights, the lift on return, the pick."""

from __future__ import annotations

import pytest

from tenants.fairness import VirtualTokenCounter, service_cost


def test_service_cost_weights_output_twice() -> None:
    """A request costs its input tokens plus twice its output tokens."""
    assert service_cost(100, 50) == 200
    assert service_cost(-5, 0) == 0


def test_vtc_charge_divides_by_weight() -> None:
    """A tenant with weight 2 accrues half the counter for the same service."""
    vtc = VirtualTokenCounter({"gold": 2.0})
    vtc.charge("gold", 300)
    vtc.charge("base", 300)
    assert (vtc.counter("gold"), vtc.counter("base")) == (150, 300)


def test_vtc_correct_replaces_the_estimate() -> None:
    """Correcting with real usage leaves the counter at the real service."""
    vtc = VirtualTokenCounter()
    vtc.charge("a", 1000)
    vtc.correct("a", estimated=1000, actual=120)
    assert vtc.counter("a") == 120


def test_vtc_pick_prefers_least_served_then_order() -> None:
    """The least-served tenant is picked; ties go to the first listed."""
    vtc = VirtualTokenCounter()
    vtc.charge("a", 10)
    assert vtc.pick(["a", "b", "c"]) == "b"
    with pytest.raises(ValueError):
        vtc.pick([])


def test_vtc_returning_tenant_is_lifted_to_backlog_minimum() -> None:
    """A tenant joining the backlog is lifted to the smallest backlogged counter."""
    vtc = VirtualTokenCounter()
    vtc.charge("a", 500)
    vtc.charge("b", 300)
    vtc.on_backlogged("idle", {"a", "b"})
    assert vtc.counter("idle") == 300


def test_vtc_lift_never_lowers_a_counter() -> None:
    """A tenant already ahead of the backlog keeps its higher counter."""
    vtc = VirtualTokenCounter()
    vtc.charge("hog", 900)
    vtc.charge("a", 100)
    vtc.on_backlogged("hog", {"a"})
    assert vtc.counter("hog") == 900


def test_vtc_backlogged_tenant_is_not_lifted() -> None:
    """A tenant already in the backlog keeps its counter when it sends more."""
    vtc = VirtualTokenCounter()
    vtc.charge("b", 300)
    vtc.on_backlogged("a", {"a", "b"})
    assert vtc.counter("a") == 0


def test_vtc_empty_backlog_lifts_to_last_to_leave() -> None:
    """With nobody waiting, the reference is the tenant that left the backlog last."""
    vtc = VirtualTokenCounter()
    vtc.charge("a", 400)
    vtc.on_idle("a")
    vtc.on_backlogged("b", set())
    assert vtc.counter("b") == 400


def test_vtc_rejects_non_positive_weights() -> None:
    """Weights must be positive."""
    with pytest.raises(ValueError):
        VirtualTokenCounter({"x": 0.0})
