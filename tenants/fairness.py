"""Fair sharing between tenants: the Virtual Token Counter (VTC, arXiv 2401.00588).

Each tenant has a counter of the weighted service it has received, divided by
its weight. Service is measured in tokens, input weighted 1 and output 2 (the
paper's cost function): charged from the request's estimate when it is granted,
corrected with the engine's reported usage when it finishes. The next request
comes from the backlogged tenant with the smallest counter. A tenant that joins
the backlog after being idle has its counter lifted to the smallest counter of
the tenants already waiting (or of the last one to leave), so idling does not
bank credit it could spend later to starve the others.

This module only keeps the books; it never decides when to grant.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

INPUT_TOKEN_WEIGHT = 1
OUTPUT_TOKEN_WEIGHT = 2


def service_cost(input_tokens: int, output_tokens: int) -> int:
    """Weighted service of one request: input tokens x1 plus output tokens x2."""
    return INPUT_TOKEN_WEIGHT * max(input_tokens, 0) + OUTPUT_TOKEN_WEIGHT * max(output_tokens, 0)


class VirtualTokenCounter:
    """Per-tenant service counters, normalised by each tenant's weight."""

    def __init__(
        self, weights: Mapping[str, float] | None = None, default_weight: float = 1.0
    ) -> None:
        if default_weight <= 0 or any(w <= 0 for w in (weights or {}).values()):
            raise ValueError("tenant weights must be positive")
        self._weights = dict(weights or {})
        self._default_weight = default_weight
        self._counters: dict[str, float] = {}
        self._last_left: str | None = None

    def set_weights(self, weights: Mapping[str, float], default_weight: float) -> None:
        """New weights from now on; the service counted so far stays."""
        if default_weight <= 0 or any(w <= 0 for w in weights.values()):
            raise ValueError("tenant weights must be positive")
        self._weights = dict(weights)
        self._default_weight = default_weight

    def weight(self, tenant: str) -> float:
        return self._weights.get(tenant, self._default_weight)

    def counter(self, tenant: str) -> float:
        return self._counters.get(tenant, 0.0)

    def on_backlogged(self, tenant: str, backlogged: Collection[str]) -> None:
        """Lift a tenant that joins the backlog (VTC's counter lift).

        1. A tenant already in `backlogged` keeps its counter.
        2. The reference set is the backlogged tenants; if there are none, the
           tenant that left the backlog last; if there is none either, no lift.
        3. The counter becomes max(own, min of the reference counters).
        """
        # 1
        if tenant in backlogged:
            return
        # 2
        if backlogged:
            floor = min(self.counter(t) for t in backlogged)
        elif self._last_left is not None:
            floor = self.counter(self._last_left)
        else:
            return
        # 3
        self._counters[tenant] = max(self.counter(tenant), floor)

    def on_idle(self, tenant: str) -> None:
        """Remember `tenant` as the last to leave the backlog."""
        self._last_left = tenant

    def charge(self, tenant: str, cost: float) -> None:
        """Add `cost` weighted tokens of service to `tenant`."""
        # `weight` and `counter` inlined: twice per request (grant, then correction)
        weight = self._weights.get(tenant, self._default_weight)
        self._counters[tenant] = self._counters.get(tenant, 0.0) + cost / weight

    def correct(self, tenant: str, estimated: float, actual: float) -> None:
        """Replace an earlier estimate with the service the engine actually reported."""
        self.charge(tenant, actual - estimated)

    def pick(self, tenants: Iterable[str]) -> str:
        """The tenant with the smallest counter; ties go to the first in `tenants`."""
        best: str | None = None
        best_counter = 0.0
        for tenant in tenants:
            c = self.counter(tenant)
            if best is None or c < best_counter:
                best, best_counter = tenant, c
        if best is None:
            raise ValueError("pick needs at least one tenant")
        return best
