"""In-flight caps per tenant (`max_in_flight`): how many of a tenant's requests are at the
engines, and whether one more may go (plain state, no clock, no I/O).

A tenant at its cap is passed over when a slot frees (`slot_groups.next_ticket`'s
`eligible`); its waiters keep their place and fair share is unchanged. Across replicas
(`SchedulerConfig.shared_in_flight`) the cap is counted in a store every replica shares:
a capped tenant's request also needs a permit, asked for with `PermitEffects.want_permit`
(once at a time per tenant), granted back as `PermitGranted`, used by one grant and given
back with `release_permit` when that request ends.
"""

from __future__ import annotations

from collections import Counter

from runner.scheduler.config import SchedulerConfig
from runner.scheduler.effects import PermitEffects


class TenantCaps:
    def __init__(self, config: SchedulerConfig, permits: PermitEffects | None) -> None:
        self.config = config  # replaced by the scheduler on TenantsChanged
        self._effects = permits
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

    def capped(self, tenant: str) -> bool:
        return self.config.in_flight_cap(tenant) is not None

    def started(self, tenant: str) -> None:
        """A request of `tenant` was granted (it used a permit, with shared caps)."""
        self._flight[tenant] += 1
        if self._shared(tenant):
            self._held[tenant] -= 1

    def finished(self, tenant: str) -> None:
        """A request of `tenant` ended: its permit goes back."""
        self._flight[tenant] -= 1
        if self._flight[tenant] <= 0:
            del self._flight[tenant]
        if self._shared(tenant):
            assert self._effects is not None
            self._effects.release_permit(tenant)

    def granted(self, tenant: str) -> None:
        """A permit came (`PermitGranted`)."""
        self._wanting.discard(tenant)
        self._held[tenant] += 1

    def return_unused(self, tenant: str) -> None:
        """A permit that no waiter could use now goes back."""
        if self._held[tenant] > 0 and self._effects is not None:
            self._held[tenant] -= 1
            self._effects.release_permit(tenant)

    def want(self, tenant: str, waiting: int) -> None:
        """Shared caps: ask for a permit when the tenant has `waiting` requests, is below
        its cap counting the permits it holds, and has not asked already."""
        cap = self.config.in_flight_cap(tenant)
        if (
            cap is None
            or not self._shared(tenant)
            or tenant in self._wanting
            or not waiting
            or self._flight[tenant] + self._held[tenant] >= cap
        ):
            return
        self._wanting.add(tenant)
        assert self._effects is not None
        self._effects.want_permit(tenant)

    def by_tenant(self) -> dict[str, int]:
        return {t: n for t, n in self._flight.items() if n > 0}
