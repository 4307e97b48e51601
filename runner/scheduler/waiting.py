"""The waiting room: requests queued for a slot, by model, band and tenant.

Within one (model, band, tenant) the requests are a FIFO ordered by ticket id.
The room only stores and counts; the scheduler chooses which head goes next.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterator, KeysView, Mapping
from typing import TypeVar

from runner.scheduler.events import Band, Ticket

Chooser = Callable[[list[Ticket]], Ticket]
K = TypeVar("K")


class WaitingRoom:
    def __init__(self) -> None:
        self._queues: dict[str, dict[Band, dict[str, deque[Ticket]]]] = {}
        # ticket id -> (ticket, current band); insertion order is arrival order.
        self._where: dict[int, tuple[Ticket, Band]] = {}
        self._per_tenant: Counter[str] = Counter()
        self._per_band: Counter[Band] = Counter()
        self._per_model: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, ticket_id: object) -> bool:
        return ticket_id in self._where

    def __iter__(self) -> Iterator[Ticket]:
        """Waiting tickets, oldest first."""
        return (ticket for ticket, _ in list(self._where.values()))

    def tenant_depth(self, tenant: str) -> int:
        return self._per_tenant[tenant]

    def band_depth(self, band: Band) -> int:
        return self._per_band[band]

    def model_depth(self, model: str) -> int:
        return self._per_model[model]

    def top_band(self, model: str) -> Band | None:
        """The most important band with a request waiting for `model`; `None` if none waits."""
        bands = self._queues.get(model)
        if bands:
            for band in (Band.HIGH, Band.NORMAL, Band.LOW):
                if bands.get(band):
                    return band
        return None

    def for_model(self, model: str) -> list[Ticket]:
        """The tickets waiting for `model`, oldest first (a copy: safe to drop them)."""
        if not self._per_model[model]:
            return []
        return [ticket for ticket, _ in self._where.values() if ticket.model == model]

    def band(self, model: str, band: Band) -> Mapping[str, deque[Ticket]]:
        """The tenants' FIFOs waiting for `model` in `band` (read-only: a view, not a copy)."""
        return self._queues.get(model, {}).get(band, {})

    def models_of(self, tenant: str) -> list[str]:
        """The models `tenant` has a request waiting for, by name."""
        if not self._per_tenant[tenant]:
            return []
        return sorted({t.model for t, _ in self._where.values() if t.tenant == tenant})

    def tenants(self) -> KeysView[str]:
        """Tenants with at least one waiting request (the backlog)."""
        return self._per_tenant.keys()

    def add(self, ticket: Ticket, band: Band | None = None) -> None:
        band = ticket.band if band is None else band
        fifo = self._queues.setdefault(ticket.model, {}).setdefault(band, {})
        _insert_in_order(fifo.setdefault(ticket.tenant, deque()), ticket)
        self._where[ticket.ticket_id] = (ticket, band)
        self._per_tenant[ticket.tenant] += 1
        self._per_band[band] += 1
        self._per_model[ticket.model] += 1

    def remove(self, ticket_id: int) -> Ticket | None:
        """Take one ticket out wherever it waits; `None` if it is not waiting."""
        found = self._where.get(ticket_id)
        if found is None:
            return None
        ticket, band = found
        fifo = self._queues[ticket.model][band]
        fifo[ticket.tenant].remove(ticket)
        self._forget(ticket, band, fifo)
        return ticket

    def take(self, model: str, choose: Chooser) -> Ticket | None:
        """Pop the head `choose` picks among the tenants' heads of the model's top band."""
        for band in (Band.HIGH, Band.NORMAL, Band.LOW):
            fifo = self._queues.get(model, {}).get(band)
            if fifo:
                heads = sorted((q[0] for q in fifo.values()), key=lambda t: t.ticket_id)
                ticket = choose(heads)
                fifo[ticket.tenant].popleft()
                self._forget(ticket, band, fifo)
                return ticket
        return None

    def promote_low(self, now: float, age_s: float) -> int:
        """Move every `low` request waiting at least `age_s` to `normal`; return how many.

        A promoted ticket keeps its place in arrival order (timeouts still see it
        as old) and joins its tenant's `normal` FIFO at its ticket-id position.
        """
        moved = 0
        for bands in self._queues.values():
            low = bands.get(Band.LOW)
            if not low:
                continue
            normal = bands.setdefault(Band.NORMAL, {})
            for tenant in list(low):
                queue = low[tenant]
                while queue and now - queue[0].arrived_at >= age_s:
                    ticket = queue.popleft()
                    _insert_in_order(normal.setdefault(tenant, deque()), ticket)
                    self._where[ticket.ticket_id] = (ticket, Band.NORMAL)
                    _decrement(self._per_band, Band.LOW)
                    self._per_band[Band.NORMAL] += 1
                    moved += 1
                if not queue:
                    del low[tenant]
        return moved

    def overdue(self, now: float, timeout_s: float) -> list[Ticket]:
        """Tickets that have waited at least `timeout_s` (oldest first), left in place."""
        late: list[Ticket] = []
        for ticket, _ in self._where.values():
            if now - ticket.arrived_at < timeout_s:
                break
            late.append(ticket)
        return late

    def _forget(self, ticket: Ticket, band: Band, fifo: dict[str, deque[Ticket]]) -> None:
        if not fifo[ticket.tenant]:
            del fifo[ticket.tenant]
        del self._where[ticket.ticket_id]
        _decrement(self._per_tenant, ticket.tenant)
        _decrement(self._per_band, band)
        _decrement(self._per_model, ticket.model)


def _decrement(counter: Counter[K], key: K) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


def _insert_in_order(queue: deque[Ticket], ticket: Ticket) -> None:
    """Append, or insert before the first younger ticket (promotions arrive out of order)."""
    if not queue or queue[-1].ticket_id < ticket.ticket_id:
        queue.append(ticket)
        return
    for i, other in enumerate(queue):
        if other.ticket_id > ticket.ticket_id:
            queue.insert(i, ticket)
            return
    queue.append(ticket)
