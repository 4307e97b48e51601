"""How long a new request would wait for its slot, from what the scheduler knows now (pure).

Two pure functions; the scheduler gathers their inputs (`Scheduler.forecast`), and the
same figures serve the deadline check at admission, `/v1/capabilities`
(`queue.forecastWaitMs`) and the gauges.

- `position`: how many requests already waiting would be served before this one, by
  priority band and, within the band, by fair share (VTC counters) or arrival order.
- `forecast_wait_s`: when the slot of the request at that position frees, from the
  model's slots, the requests in flight and how long they have left, the measured
  service time (grant to `ServeDone`, a recent mean) and when the model can serve at
  all (a load in progress, or a restart due: its eta).

What it cannot know: requests that arrive later and go first (a higher band, or a
tenant with less service), `low` requests promoted by aging, and engines whose service
time changes with their load. Without a measured service time it forecasts only what
it knows for sure (the eta, and no wait behind a free slot) and says `None` otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TenantQueue:
    """One other tenant's waiting requests in the band: its VTC counter, weight, and the
    estimated costs of its requests in the order they will be served."""

    counter: float
    weight: float
    costs: Sequence[int]


def position(
    higher: int,
    own: Sequence[int],
    counter: float,
    weight: float,
    others: Mapping[str, TenantQueue],
    *,
    fair: bool,
) -> int:
    """Requests served before a new one that joins the back of its tenant's queue.

    1. Every request waiting in a more important band for the model goes first.
    2. Not fair (plain FCFS within the band): everyone already waiting in the band.
    3. Fair: the tenant's own waiting requests (`own`, their costs) go first; its counter
       then reaches `counter + sum(own) / weight`, the value it has when this request
       is picked. Another tenant is served while its counter is at most that (VTC picks
       the smallest counter, ties to the older head, theirs): count its requests, in
       order, until its counter would pass it.
    """
    ahead = higher  # 1
    if not fair:  # 2
        return ahead + len(own) + sum(len(q.costs) for q in others.values())
    ahead += len(own)  # 3
    target = counter + sum(own) / weight
    for queue in others.values():
        reached = queue.counter
        for cost in queue.costs:
            if reached > target:
                break
            ahead += 1
            reached += cost / queue.weight
    return ahead


def forecast_wait_s(
    ahead: int,
    slots: int,
    running_s: Sequence[float],
    service_s: float | None,
    opens_in_s: float = 0.0,
) -> float | None:
    """Seconds until the request with `ahead` requests before it gets a slot.

    1. Each slot's free time: a request in flight holds its slot for what is left of
       the service time (`service_s` minus how long it has run, `running_s`; at least
       0); the other slots are free now. More in flight than slots (the concurrency
       shrank): the slots are those freed last.
    2. No slot serves before the model opens (`opens_in_s`: a load or restart's eta).
    3. The requests ahead, then this one, take the slots in the order they free, each
       holding one for `service_s`: every free time lies within one service time of
       the earliest, so that order is round-robin and request `k` starts at
       `free[k % slots] + (k // slots) * service_s`.
    4. Without a measured service time: when this request takes a slot that is free
       now, the model's eta; otherwise `None` (unknown).
    """
    slots = max(slots, 1)
    opens = max(opens_in_s, 0.0)
    rounds, slot = divmod(max(ahead, 0), slots)
    idle = max(slots - len(running_s), 0)
    if service_s is None:  # 4
        return opens if rounds == 0 and slot < idle else None
    service = max(service_s, 0.0)
    busy = sorted(max(service - r, 0.0) for r in running_s)  # 1
    free = [0.0] * idle + busy[max(len(busy) - slots, 0) :]
    free = sorted(max(t, opens) for t in free)  # 2
    return free[slot] + rounds * service  # 3
