"""In-flight caps per tenant (`max_in_flight`) and tenant policy changes: how many of a
tenant's requests are at the engines, whether one more may go, and what a new policy
changes (plain state, no clock, no I/O).

A tenant at its cap is passed over when a slot frees (`slot_groups.next_ticket`'s
`eligible`); its waiters keep their place and fair share is unchanged. Across replicas
(`SchedulerConfig.shared_in_flight`) the cap is counted in a store every replica shares:
a capped tenant's request also needs a permit, asked for with `PermitEffects.want_permit`
(once at a time per tenant, and only while it has more waiters than permits), granted back
as `PermitGranted`, used by one grant and given back with `release_permit` when that
request ends. A permit that no waiter can use yet (their model's slots are full) is kept
for the next slot that frees, so in flight plus held never exceeds the cap on all
replicas together; one whose waiters have left goes back at once (`trim`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Protocol

from runner.scheduler.config import SchedulerConfig
from runner.scheduler.effects import PermitEffects
from runner.scheduler.events import TenantsChanged


class TenantRequests(Protocol):
    """What the caps ask of the request half (`core.Scheduler`)."""

    def tenant_depth(self, tenant: str) -> int: ...

    def dispatch_tenant(self, tenant: str, now: float) -> None: ...


class TenantCaps:
    def __init__(
        self, config: SchedulerConfig, permits: PermitEffects | None, queue: TenantRequests
    ) -> None:
        self.config = config  # replaced on TenantsChanged (`changed`)
        self._effects = permits
        self._queue = queue
        self._flight: Counter[str] = Counter()  # requests in flight per tenant
        self._held: Counter[str] = Counter()  # shared caps: permits held, not used yet
        self._wanting: set[str] = set()  # shared caps: a permit asked for, not granted yet

    def _shared(self, tenant: str) -> bool:
        return (
            self.config.shared_in_flight
            and self._effects is not None
            and self.config.in_flight_cap(tenant) is not None
        )

    def eligible(self, tenant: str) -> bool:
        """Whether a request of `tenant` may be granted now: no cap, or below it (and,
        with shared caps, a permit held)."""
        cap = self.config.in_flight_cap(tenant)
        if cap is None:
            return True
        if self._flight[tenant] >= cap:
            return False
        return not self._shared(tenant) or self._held[tenant] > 0

    # -- what the scheduler tells it ------------------------------------------------

    def started(self, tenant: str) -> None:
        """A request of `tenant` was granted (it used a permit, with shared caps)."""
        self._flight[tenant] += 1
        if self.config.shared_in_flight and self._shared(tenant):  # (the common case first)
            self._held[tenant] -= 1

    def finished(self, tenant: str) -> bool:
        """A request of `tenant` ended: its permit goes back. True when the tenant is
        capped (its waiters for any model may go now: `may_go`)."""
        self._flight[tenant] -= 1
        if self._flight[tenant] <= 0:
            del self._flight[tenant]
        if self.config.shared_in_flight and self._shared(tenant):
            assert self._effects is not None
            self._effects.release_permit(tenant)
        return self.config.in_flight_cap(tenant) is not None

    def may_go(self, tenant: str, now: float) -> None:
        """Serve what the tenant may now (every model it waits for), then ask for a
        permit if it still has waiters without one."""
        self._queue.dispatch_tenant(tenant, now)
        self.want(tenant)

    def on_permit(self, tenant: str, now: float) -> None:
        """A permit came (`PermitGranted`): serve a waiter with it; one nobody waits for
        any more goes back."""
        self._wanting.discard(tenant)
        self._held[tenant] += 1
        self._queue.dispatch_tenant(tenant, now)
        self.trim(tenant)
        self.want(tenant)

    def changed(self, config: SchedulerConfig, event: TenantsChanged) -> SchedulerConfig:
        """The scheduler's configuration with the event's weights and caps; kept here too."""
        self.config = replace(
            config,
            tenant_weights=dict(event.tenant_weights),
            default_weight=event.default_weight,
            tenant_queue_caps=dict(event.tenant_queue_caps),
            default_tenant_queue_cap=event.default_tenant_queue_cap,
            tenant_in_flight_caps=dict(event.tenant_in_flight_caps),
            default_in_flight_cap=event.default_in_flight_cap,
        )
        return self.config

    def trim(self, tenant: str) -> None:
        """Give back the permits held beyond the tenant's waiters (they left, or were
        refused), so no replica keeps a share of the cap for nobody."""
        surplus = self._held[tenant] - self._queue.tenant_depth(tenant)
        while surplus > 0 and self._effects is not None:
            self._held[tenant] -= 1
            surplus -= 1
            self._effects.release_permit(tenant)
        if not self._held[tenant]:
            del self._held[tenant]

    def want(self, tenant: str) -> None:
        """Shared caps: ask for a permit when the tenant has more waiters than permits,
        is below its cap counting the permits it holds, and has not asked already."""
        cap = self.config.in_flight_cap(tenant)
        held = self._held[tenant]
        if (
            cap is None
            or not self._shared(tenant)
            or tenant in self._wanting
            or self._queue.tenant_depth(tenant) <= held
            or self._flight[tenant] + held >= cap
        ):
            return
        self._wanting.add(tenant)
        assert self._effects is not None
        self._effects.want_permit(tenant)

    def by_tenant(self) -> dict[str, int]:
        return {t: n for t, n in self._flight.items() if n > 0}

    def in_flight(self, tenant: str) -> int:
        return self._flight[tenant]
