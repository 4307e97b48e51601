"""`Retry-After` on a scheduler refusal: when will a place open for this client?

A client refused with `queue_full` (or `tenant_queue_full`, `queue_timeout`) needs a place
in the queue, not the whole queue drained: one opens at the next completion. Everyone
refused in one burst needs a place of their own, so each is sent back after the ones
already due back before it. What the scheduler knows decides it (docs/benchmarks.md,
"Retry-After that holds (P16)", has the measurements that chose it):

- each request in flight, how long it has run, and its model's mean service time (grant
  to `ServeDone`, measured over busy time only, so idle minutes never dilute it:
  `deadlines.ServiceTimes`);
- how many refused clients are due back and have not come yet (`PromisedReturns`).

`retry_after_s` is pure; `PromisedReturns` is the little state the scheduler keeps for it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

HEADROOM = 1.5
"""Places a returning client is counted to need per client due back before it: new
arrivals take some of the opened places too (1.5 leaves them a third)."""
IDLE_INTERVAL_S = 1.0
"""Seconds between opened places assumed when nothing is in flight (a model loading)."""
MAX_S = 3600
MAX_PROMISES = 10_000
"""Return times kept at most (beyond, every answer is near `MAX_S` anyway)."""


def retry_after_s(
    running: Sequence[tuple[float, float | None]], pending: int, headroom: float = HEADROOM
) -> int:
    """Seconds a refused client should wait before it comes back.

    `running` holds one `(age_s, service_s)` per request in flight: how long it has run
    and its model's mean service time (`None` before any completion); `pending` the
    refused clients due back before this one.

    1. Each request's expected service time: its model's mean, or before any completion
       what it has run so far, at least 1 s (never the queue timeout).
    2. `next_free`: when the first place opens, the least time a request in flight has
       left (0 when one is overdue, or when nothing is in flight).
    3. `interval`: the time between two opened places while all run,
       1 / sum(1 / service); `IDLE_INTERVAL_S` when nothing is in flight.
    4. `next_free + headroom * pending * interval`: after the ones due back before it.
    5. Whole seconds, rounded up, clamped to 1..3600: never zero, never absurd.
    """
    services = [(age, s if s is not None else max(age, 1.0)) for age, s in running]  # 1
    next_free = max(0.0, min((s - age for age, s in services), default=0.0))  # 2
    rate = sum(1.0 / max(s, 1e-3) for _, s in services)  # 3
    interval = 1.0 / rate if rate > 0 else IDLE_INTERVAL_S
    seconds = next_free + headroom * max(pending, 0) * interval  # 4
    return min(max(math.ceil(seconds - 1e-9), 1), MAX_S)  # 5


class PromisedReturns:
    """The times refused clients were told to come back, until they pass."""

    def __init__(self) -> None:
        self._due: list[float] = []  # a heap of return times

    def pending(self, now: float) -> int:
        """Refused clients whose `Retry-After` has not elapsed at `now`."""
        due = self._due
        while due and due[0] <= now:
            heapq.heappop(due)
        return len(due)

    def promise(self, at: float) -> None:
        if len(self._due) < MAX_PROMISES:
            heapq.heappush(self._due, at)
