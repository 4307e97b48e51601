"""Deadlines: what the scheduler measures to forecast a wait, and when waiters expire.

A request may carry a deadline (`AdmissionRequest.deadline_ms`: how long its client
waits for the first byte, `X-Request-Deadline-Ms`). The scheduler refuses it at once
when the forecast wait (`forecast.py`) exceeds it (503 `deadline_unreachable`), and
drops it from the queue the moment the deadline passes (504 `deadline_exceeded`).

- `ServiceTimes`: each model's recent mean service time (grant to `ServeDone`) and
  how long each request in flight has run.
- `DeadlineBook`: the waiters' deadlines in time order (a heap; entries of requests
  that left the queue are skipped when they come due).
- `Outlook`: gathers `forecast.py`'s inputs from the scheduler's parts. It only reads.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from runner.scheduler.errors import DeadlineExceeded, DeadlineUnreachable, SchedulerError
from runner.scheduler.events import Band, Ticket
from runner.scheduler.forecast import TenantQueue, forecast_wait_s, position
from runner.scheduler.models import ModelRecord, ModelState, ModelTable
from runner.scheduler.waiting import WaitingRoom
from tenants.fairness import VirtualTokenCounter

SERVICE_SAMPLES = 32
"""Completions per model the mean service time is taken over."""


class ServiceTimes:
    """Per model: when each request in flight was granted, and the recent service times."""

    def __init__(self, samples: int = SERVICE_SAMPLES) -> None:
        self._samples = samples
        self._running: dict[str, dict[int, float]] = {}
        self._done: dict[str, deque[float]] = {}
        self._sums: dict[str, float] = {}

    def started(self, ticket: Ticket, now: float) -> None:
        self._running.setdefault(ticket.model, {})[ticket.ticket_id] = now

    def finished(self, ticket: Ticket, now: float) -> None:
        running = self._running.get(ticket.model, {})
        began = running.pop(ticket.ticket_id, None)
        if began is None:
            return
        done = self._done.setdefault(ticket.model, deque())
        if len(done) >= self._samples:
            self._sums[ticket.model] -= done.popleft()
        took = max(now - began, 0.0)
        done.append(took)
        self._sums[ticket.model] = self._sums.get(ticket.model, 0.0) + took

    def mean_s(self, model: str) -> float | None:
        """The model's mean service time over its last completions; `None` before any."""
        done = self._done.get(model)
        return max(self._sums[model], 0.0) / len(done) if done else None

    def running_s(self, model: str, now: float) -> list[float]:
        """How long each of the model's requests in flight has run."""
        return [now - began for began in self._running.get(model, {}).values()]


class DeadlineBook:
    """Waiters' deadlines, earliest first."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Ticket]] = []

    def add(self, ticket: Ticket) -> None:
        """Book the ticket's deadline, if it has one."""
        if ticket.deadline_at is not None:
            heapq.heappush(self._heap, (ticket.deadline_at, ticket.ticket_id, ticket))

    def due(self, now: float) -> list[Ticket]:
        """Tickets whose deadline is at or before `now` (taken out of the book), whether
        or not they still wait."""
        heap, due = self._heap, []
        while heap and heap[0][0] <= now:
            due.append(heapq.heappop(heap)[2])
        return due


def deadline_exceeded(ticket: Ticket, now: float) -> SchedulerError:
    """504 `deadline_exceeded` for a waiter whose deadline has come."""
    waited_ms = round(1000 * (now - ticket.arrived_at))
    return DeadlineExceeded(queueWaitMs=waited_ms, deadlineMs=ticket.request.deadline_ms)


def opens_in_s(record: ModelRecord, wanted: bool, now: float) -> float:
    """Seconds until the model can serve, from its last load time (`load_s`; a model
    never loaded here counts 0: a lower bound).

    1. Ready and not wanted: now.
    2. Loading: what its last load time leaves of this one.
    3. Failed with a restart due: until the restart, plus a load.
    4. Otherwise (wanted, autoload, coming back after an eviction): a whole load.
    """
    load = record.load_s or 0.0
    if record.state is ModelState.READY and not wanted:  # 1
        return 0.0
    if record.state is ModelState.LOADING:  # 2
        return max(record.since + load - now, 0.0)
    if record.state is ModelState.FAILED and record.restart_at is not None:  # 3
        return max(record.restart_at - now, 0.0) + load
    return load  # 4


class Outlook:
    """The forecast of a new request's wait, from the scheduler's own parts (read-only)."""

    def __init__(
        self,
        table: ModelTable,
        waiting: WaitingRoom,
        vtc: VirtualTokenCounter,
        service: ServiceTimes,
        *,
        fair: bool,
    ) -> None:
        self._table = table
        self._waiting = waiting
        self._vtc = vtc
        self._service = service
        self._fair = fair

    def wait_s(self, model: str, band: Band, tenant: str, now: float) -> float | None:
        """The forecast wait of a new request of `tenant` in `band` for `model` (seconds);
        `None` when it cannot be told (unknown model, no service time measured yet)."""
        record = self._table.get(model)
        if record is None:
            return None
        ahead = position(
            sum(
                sum(len(q) for q in self._waiting.band(model, b).values()) for b in Band if b > band
            ),
            [t.cost for t in self._waiting.band(model, band).get(tenant, ())],
            self._lifted(tenant),
            self._vtc.weight(tenant),
            {
                other: TenantQueue(
                    self._vtc.counter(other), self._vtc.weight(other), [t.cost for t in fifo]
                )
                for other, fifo in self._waiting.band(model, band).items()
                if other != tenant
            },
            fair=self._fair,
        )
        return forecast_wait_s(
            ahead,
            record.concurrency,
            self._service.running_s(model, now),
            self._service.mean_s(model),
            opens_in_s(record, model in self._table.wants, now),
        )

    def by_model(self, now: float, models: list[str]) -> dict[str, dict[str, int]]:
        """Milliseconds a new request of a new tenant would wait, per model and priority
        (models whose forecast is unknown are left out)."""
        out: dict[str, dict[str, int]] = {}
        for model in models:
            waits = {b.label: self.wait_s(model, b, "", now) for b in Band}
            if all(w is not None for w in waits.values()):
                out[model] = {label: round(1000 * (w or 0.0)) for label, w in waits.items()}
        return out

    def _lifted(self, tenant: str) -> float:
        """The tenant's counter once it joins the backlog (VTC's lift, without changing it)."""
        backlog = self._waiting.tenants()
        own = self._vtc.counter(tenant)
        if tenant in backlog or not backlog:
            return own
        return max(own, min(self._vtc.counter(t) for t in backlog))


def deadline_refusal(forecast_s: float | None, deadline_ms: int | None) -> SchedulerError | None:
    """Whether a request that would wait is refused for its deadline, at once.

    1. No deadline, or no forecast (nothing measured yet): admitted.
    2. A forecast within the deadline: admitted.
    3. Otherwise 503 `deadline_unreachable` with the forecast, and a `Retry-After` of
       the excess rounded up (1..3600 s): by then the queue ahead should have drained
       enough for the same deadline.
    """
    if deadline_ms is None or forecast_s is None:  # 1
        return None
    forecast_ms = round(1000 * forecast_s)
    if forecast_ms <= deadline_ms:  # 2
        return None
    retry = min(max(math.ceil((forecast_ms - deadline_ms) / 1000), 1), 3600)  # 3
    return DeadlineUnreachable(
        forecastWaitMs=forecast_ms, deadlineMs=deadline_ms, retry_after=retry
    )
