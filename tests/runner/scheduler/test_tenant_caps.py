"""In-flight caps per tenant: a capped tenant waits in the queue (never refused), others
pass it, fair share is unchanged; across replicas it needs a permit of the shared cap."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from runner.scheduler.config import SchedulerConfig
from runner.scheduler.events import PermitGranted, TenantsChanged
from tests.runner.scheduler.fakes import Driver

pytestmark = pytest.mark.timeout(10)


def capped(caps: dict[str, int], *, shared: bool = False, slots: int = 8) -> SchedulerConfig:
    return SchedulerConfig(
        default_concurrency=slots, max_queue_depth=100, queue_timeout_s=None,
        tenant_in_flight_caps=caps, shared_in_flight=shared,
    )  # fmt: skip


@dataclass
class Permits:
    wanted: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)

    def want_permit(self, tenant: str) -> None:
        self.wanted.append(tenant)

    def release_permit(self, tenant: str) -> None:
        self.released.append(tenant)


def test_tenant_caps_hold_a_tenant_at_its_cap_in_the_queue() -> None:
    """With 8 slots and a cap of 2, the third request of the tenant waits (not refused)
    and is granted when one of the two ends; another tenant is granted meanwhile."""
    d = Driver(capped({"acme": 2}))
    a1, a2, a3 = d.arrive("acme"), d.arrive("acme"), d.arrive("acme")
    other = d.arrive("globex")
    assert d.effects.granted_ids == [a1, a2, other]
    assert d.effects.rejected == [] and d.core.queue_depth() == 1
    assert d.core.caps.by_tenant() == {"acme": 2, "globex": 1}
    d.done(a1)
    assert d.effects.granted_ids[-1] == a3


def test_tenant_caps_let_lower_bands_pass_a_capped_tenant() -> None:
    """A slot frees while a capped tenant's high request waits: a normal request of another
    tenant gets it; the capped tenant's waiter keeps its place."""
    d = Driver(capped({"acme": 1}, slots=1))
    first = d.arrive("acme")
    high = d.arrive("acme", priority="high")
    normal = d.arrive("globex")
    assert d.effects.granted_ids == [first]
    d.done(first)  # acme may go again: its high request is first
    assert d.effects.granted_ids == [first, high]
    d.done(high)
    assert d.effects.granted_ids == [first, high, normal]


def test_tenant_caps_raised_by_a_policy_change_let_waiters_go() -> None:
    """A raised cap (TenantsChanged) grants the tenant's waiters at once."""
    d = Driver(capped({"acme": 1}))
    ids = [d.arrive("acme") for _ in range(3)]
    assert d.effects.granted_ids == ids[:1]
    d.core.handle(TenantsChanged({}, 1.0, {}, None, {"acme": 3}, None, d.now))
    assert d.effects.granted_ids == ids


def test_tenant_caps_shared_need_a_permit_per_request() -> None:
    """Shared caps: a request waits for a permit (asked once at a time), is granted with
    it, and gives it back when it ends; a permit nobody can use goes back at once."""
    permits = Permits()
    config = capped({"acme": 2}, shared=True)
    d = Driver(config)
    d.core = type(d.core)(config, d.effects, permits=permits)
    first, second = d.arrive("acme"), d.arrive("acme")
    assert d.effects.granted_ids == [] and permits.wanted == ["acme"]
    d.core.handle(PermitGranted("acme", d.now))
    assert d.effects.granted_ids == [first] and permits.wanted == ["acme", "acme"]
    d.core.handle(PermitGranted("acme", d.now))
    assert d.effects.granted_ids == [first, second]
    d.done(first)
    assert permits.released == ["acme"]
    d.cancel(d.arrive("acme"))  # asks, then leaves before the permit comes
    d.core.handle(PermitGranted("acme", d.now))
    assert permits.released == ["acme", "acme"]


def test_tenant_caps_shared_keep_a_permit_for_a_full_model() -> None:
    """Shared caps: a permit that finds the model's slots full is kept (not given back and
    asked for again in a loop) and serves the waiter when a slot frees."""
    permits = Permits()
    config = capped({"acme": 2}, shared=True, slots=1)
    d = Driver(config)
    d.core = type(d.core)(config, d.effects, permits=permits)
    other = d.arrive("globex")  # holds the model's one slot
    waiter = d.arrive("acme")
    assert permits.wanted == ["acme"]
    d.core.handle(PermitGranted("acme", d.now))
    assert d.effects.granted_ids == [other]
    assert permits.released == [] and permits.wanted == ["acme"]  # kept, not asked again
    d.done(other)
    assert d.effects.granted_ids == [other, waiter]
    assert permits.released == []
