"""Slot groups: models on one engine process share its slots (driven against fake effects)."""

from __future__ import annotations

import pytest

from runner.scheduler.config import ModelPolicy, SchedulerConfig
from runner.scheduler.events import Band
from tests.runner.scheduler.fakes import Driver

pytestmark = pytest.mark.timeout(30)

COMFY = "comfyui:http://127.0.0.1:8188"


def driver(groups: dict[str, str | None], concurrency: int = 1) -> Driver:
    """Ready models, each in the slot group `groups` names, all with `concurrency` slots."""
    policies = {m: ModelPolicy(0, concurrency, slot_group=g) for m, g in groups.items()}
    d = Driver(SchedulerConfig(models=policies, unlisted_ready=False, low_aging_s=None))
    for model, policy in policies.items():
        d.load(model, policy)
        d.ready(model, 0, concurrency)
    return d


def test_slot_group_second_model_waits_until_the_first_ends() -> None:
    """Two models on one ComfyUI: b's request waits in the runner's queue while a's holds
    the server, and is granted when a's ends, its wait counted (7.9 s)."""
    d = driver({"a": COMFY, "b": COMFY})
    first = d.arrive(model="a")
    second = d.arrive(model="b")
    assert d.effects.granted == [(first, 0)]
    assert d.core.is_waiting(second) and d.core.waiting("b") == 1
    d.tick(7.9)
    assert d.core.is_waiting(second)
    d.done(first)
    assert d.effects.granted == [(first, 0), (second, 7900)]
    assert (d.core.in_flight("a"), d.core.in_flight("b")) == (0, 1)


def test_slot_group_different_groups_do_not_block_each_other() -> None:
    """Models on different engine processes (or none shared) are granted at once, together."""
    d = driver({"a": COMFY, "b": "comfyui:http://other:8188", "c": None})
    tickets = [d.arrive(model=m) for m in ("a", "b", "c")]
    assert d.effects.granted == [(t, 0) for t in tickets]


def test_slot_group_shares_the_groups_slots_not_each_models() -> None:
    """With two slots on the server, two requests of a fill it; b waits for one to end."""
    d = driver({"a": COMFY, "b": COMFY}, concurrency=2)
    a1, a2, b1 = d.arrive(model="a"), d.arrive(model="a"), d.arrive(model="b")
    assert d.effects.granted_ids == [a1, a2]
    d.done(a2)
    assert d.effects.granted_ids == [a1, a2, b1]


def test_slot_group_capacity_is_the_smallest_members() -> None:
    """A member that declares fewer slots caps the group: the engine never gets more."""
    policies = {"a": ModelPolicy(0, 3, slot_group=COMFY), "b": ModelPolicy(0, 1, slot_group=COMFY)}
    d = Driver(SchedulerConfig(models=policies, unlisted_ready=False))
    for model, policy in policies.items():
        d.load(model, policy)
        d.ready(model, 0, policy.concurrency)
    a1, a2 = d.arrive(model="a"), d.arrive(model="a")
    assert d.effects.granted_ids == [a1] and d.core.is_waiting(a2)


def test_slot_group_freed_slot_goes_to_the_more_important_band_across_models() -> None:
    """A slot freed by a goes to b's high request before a's earlier normal one."""
    d = driver({"a": COMFY, "b": COMFY})
    busy = d.arrive(model="a")
    normal = d.arrive(model="a")
    high = d.arrive(model="b", priority="high")
    d.done(busy)
    assert d.effects.granted_ids == [busy, high]
    d.done(high)
    assert d.effects.granted_ids == [busy, high, normal]


def test_slot_group_fair_share_across_the_models_tenants() -> None:
    """Within a band the freed slot goes to the less served tenant, whichever model it
    asked: light's request for b goes before heavy's older third one for a."""
    d = driver({"a": COMFY, "b": COMFY})
    busy = d.arrive("heavy", model="a", tokens=(1000, 1000))
    second, third = d.arrive("heavy", model="a"), d.arrive("heavy", model="a")
    light = d.arrive("light", model="b")  # lifted to heavy's counter: no credit for arriving late
    for ticket in (busy, second, light):
        d.done(ticket)
    assert d.effects.granted_ids == [busy, second, light, third]


def test_slot_group_member_loading_leaves_the_slots_to_the_others() -> None:
    """A member still loading holds no slot: the ready one serves; its own waiters wait for it."""
    policy = ModelPolicy(0, 1, slot_group=COMFY)
    d = Driver(SchedulerConfig(models={"a": policy, "b": policy}, unlisted_ready=False))
    d.load("a", policy)
    d.ready("a", 0, 1)
    d.load("b", policy)
    early_b = d.arrive(model="b")
    a1 = d.arrive(model="a")
    assert d.effects.granted_ids == [a1] and d.core.is_waiting(early_b)
    d.ready("b", 0, 1)
    assert d.core.is_waiting(early_b)  # the server's one slot is a's
    d.done(a1)
    assert d.effects.granted_ids == [a1, early_b]


def test_slot_group_forecast_counts_the_groups_requests() -> None:
    """The forecast of b's wait counts a's request holding the group's one slot and a's
    waiter ahead (timed at b's measured 2 s): 4 s, not the 0 s b's own idle slot would say.
    A deadline b cannot meet is refused with that forecast."""
    d = driver({"a": COMFY, "b": COMFY})
    warm = d.arrive(model="b")
    d.now += 2.0
    d.done(warm)  # b's service time measured: 2 s
    d.arrive(model="a")  # holds the server
    d.arrive(model="a")  # waits
    assert d.core.outlook.wait_s("b", Band.NORMAL, "new", d.now) == pytest.approx(4.0, abs=0.3)
    assert d.core.outlook.wait_s("c", Band.NORMAL, "new", d.now) is None  # unknown model
    late = d.arrive(model="b", deadline_ms=1000)
    assert d.effects.rejection(late).code == "deadline_unreachable"
