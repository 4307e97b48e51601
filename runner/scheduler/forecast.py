"""How long a new request would wait for its slot, from what the scheduler knows now (pure).

Two pure functions; the scheduler gathers their inputs (`deadlines.Outlook`), and the
same figures serve the deadline check at admission, `/v1/capabilities`
(`queue.forecastWaitMs`) and the gauges.

- `ahead`: the estimated costs of the requests already waiting that would be served
  before this one, in the order they would be: more important bands first; within the
  band, fair share replayed on the tenants' VTC counters (or arrival order).
- `forecast_wait_s`: when a slot frees for it: the slots, what the requests in flight
  have left, the service times of those ahead (their cost at the measured seconds per
  unit of cost), when the model can serve at all (a load in progress, or a restart due:
  its eta), and the share of the engine that more important bands have been taking.

What it cannot know: which requests will arrive later and go first (it assumes more
important bands keep taking the share they took recently, and nobody of less service
joins its band), `low` requests promoted by aging, and engines whose speed changes with
their load.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MAX_HIGHER_SHARE = 0.9
"""The most of the engine more important bands are assumed to keep taking."""


@dataclass(frozen=True, slots=True)
class TenantQueue:
    """One tenant's waiting requests in the band: its VTC counter and weight, and its
    requests' (ticket id, estimated cost) in the order they will be served."""

    counter: float
    weight: float
    tickets: Sequence[tuple[int, int]]


def ahead(
    higher: Sequence[int],
    tenant: str,
    band: Mapping[str, TenantQueue],
    *,
    fair: bool,
) -> list[int]:
    """Estimated costs of the requests served before a new one of `tenant`, in order
    (`ahead_tickets`, costs only; `higher` as costs)."""
    tickets = ahead_tickets([(-1, cost) for cost in higher], tenant, band, fair=fair)
    return [cost for _, cost in tickets]


def ahead_tickets(
    higher: Sequence[tuple[int, int]],
    tenant: str,
    band: Mapping[str, TenantQueue],
    *,
    fair: bool,
) -> list[tuple[int, int]]:
    """The (ticket id, estimated cost) of the requests served before a new one of
    `tenant`, in order.

    1. Every request waiting in a more important band goes first (`higher`).
    2. Not fair (FCFS within the band): everyone already waiting in the band, by arrival.
    3. Fair: VTC replayed on the band. The new request waits at the back of its tenant's
       queue (`band[tenant]`, its counter already lifted as joining the backlog would);
       the tenant with the smallest counter (ties: the oldest head; the new request is
       the youngest of all) is served next and charged cost / weight, until the new
       request's turn.
    """
    served = list(higher)  # 1
    if not fair:  # 2
        return served + sorted(t for q in band.values() for t in q.tickets)
    heads: list[tuple[float, float, str, int]] = []  # 3: (counter, head id, tenant, index)
    for name, queue in band.items():
        if queue.tickets:
            heads.append((queue.counter, queue.tickets[0][0], name, 0))
    mine = band.get(tenant)
    if mine is None or not mine.tickets:
        counter = mine.counter if mine is not None else 0.0
        heads.append((counter, float("inf"), tenant, 0))
    heapq.heapify(heads)
    while heads:
        counter, _, name, index = heapq.heappop(heads)
        found = band.get(name)
        if found is None or index >= len(found.tickets):
            return served  # the new request's turn
        queue = found
        ticket = queue.tickets[index]
        served.append(ticket)
        counter += ticket[1] / queue.weight
        if index + 1 < len(queue.tickets):
            heapq.heappush(heads, (counter, queue.tickets[index + 1][0], name, index + 1))
        elif name == tenant:
            heapq.heappush(heads, (counter, float("inf"), name, index + 1))
    return served


def forecast_wait_s(
    ahead_s: Sequence[float],
    slots: int,
    left_s: Sequence[float],
    opens_in_s: float = 0.0,
    higher_share: float = 0.0,
) -> float:
    """Seconds until a slot is free for the request after `ahead_s` (their service times,
    in service order).

    1. Each slot's free time: a request in flight holds its slot for what it has left
       (`left_s`, at least 0); the other slots are free now. More in flight than slots
       (the concurrency shrank): the slots are those freed last.
    2. No slot serves before the model opens (`opens_in_s`: a load or restart's eta).
    3. The requests ahead take, in order, the slot that frees first, each for its
       service time; this request gets the first slot free after them.
    4. More important bands keep taking `higher_share` of the engine meanwhile (their
       recent share, at most MAX_HIGHER_SHARE): the wait after the opening stretches by
       1 / (1 - share).
    """
    slots = max(slots, 1)
    opens = max(opens_in_s, 0.0)
    busy = sorted(max(left, 0.0) for left in left_s)  # 1
    free = [0.0] * max(slots - len(busy), 0) + busy[max(len(busy) - slots, 0) :]
    free = [max(t, opens) for t in free]  # 2
    heapq.heapify(free)
    for service in ahead_s:  # 3
        heapq.heappush(free, heapq.heappop(free) + max(service, 0.0))
    share = min(max(higher_share, 0.0), MAX_HIGHER_SHARE)  # 4
    return opens + (free[0] - opens) / (1 - share)
