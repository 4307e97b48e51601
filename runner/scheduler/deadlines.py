"""Deadlines: what the scheduler measures to forecast a wait, and when waiters expire.

A request may carry a deadline (`AdmissionRequest.deadline_ms`: how long its client
waits for the first byte, `X-Request-Deadline-Ms`). The scheduler refuses it at once
when the forecast wait (`forecast.py`) exceeds it (503 `deadline_unreachable`), and
drops it from the queue the moment the deadline passes (504 `deadline_exceeded`).

- `ServiceTimes`: each model's seconds per unit of estimated cost (grant to `ServeDone`,
  over its last completions) and mean service time; for requests that state their work
  (`AdmissionRequest.work`: images), the model's fit of seconds against work
  (`work_fit.py`), updated on every finish; what each request in flight has left (its
  estimate, time run and reported progress), and the share of the slots each band was
  granted recently.
- `DeadlineBook`: the waiters' deadlines in time order (a heap; entries of requests
  that left the queue are skipped when they come due).
- `Outlook`: gathers `forecast.py`'s inputs from the scheduler's parts. It only reads.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from runner.scheduler.errors import DeadlinePassed, DeadlineUnreachable, SchedulerError
from runner.scheduler.events import Band, Ticket
from runner.scheduler.forecast import TenantQueue, ahead_tickets, forecast_wait_s
from runner.scheduler.models import ModelRecord, ModelState, ModelTable
from runner.scheduler.slot_groups import SlotCounts
from runner.scheduler.waiting import WaitingRoom
from runner.scheduler.work_fit import WorkFit, remaining_s
from tenants.fairness import VirtualTokenCounter

SERVICE_SAMPLES = 32
"""Completions per model the seconds per unit of cost are taken over."""
SHARE_WINDOW_S = 30.0
"""How far back the share of the engine each band took is measured."""


class ServiceTimes:
    """Per model: the requests in flight (cost, band, grant time), the measured seconds
    per unit of estimated cost over the last completions, and the service granted to
    each band recently."""

    def __init__(self, samples: int = SERVICE_SAMPLES, window_s: float = SHARE_WINDOW_S) -> None:
        self._samples = samples
        self._window_s = window_s
        self._running: dict[str, dict[int, tuple[int, Band, float]]] = {}
        self._done: dict[str, deque[tuple[float, int]]] = {}  # (seconds, cost)
        self._sums: dict[str, list[float]] = {}  # [seconds, cost] of `_done`
        self._granted: dict[str, deque[tuple[float, Band, int]]] = {}  # (at, band, cost)
        self._band_cost: dict[str, dict[Band, int]] = {}  # cost per band in `_granted`
        self._work: dict[int, float] = {}  # the stated work of tickets in flight
        self._progress: dict[int, float] = {}  # their reported progress, 0..1
        self._fits: dict[str, WorkFit] = {}

    def started(self, ticket: Ticket, now: float) -> None:
        cost, model, band = max(ticket.cost, 1), ticket.model, ticket.band
        running = self._running.get(model)  # (not `setdefault`: it builds the default on
        if running is None:  # every grant)
            running = self._running[model] = {}
            self._granted[model] = deque()
            self._band_cost[model] = {}
        running[ticket.ticket_id] = (cost, band, now)
        if ticket.request.work is not None:
            self._work[ticket.ticket_id] = ticket.request.work
        granted = self._granted[model]
        granted.append((now, band, cost))
        per_band = self._band_cost[model]
        per_band[band] = per_band.get(band, 0) + cost
        if now - granted[0][0] > self._window_s:  # (not a call per grant when none is due)
            self._expire(model, now)

    def _expire(self, model: str, now: float) -> None:
        """Forget grants older than the window, and their cost in the per-band sums."""
        granted, per_band = self._granted.get(model), self._band_cost.get(model)
        while granted and per_band is not None and now - granted[0][0] > self._window_s:
            _, band, cost = granted.popleft()
            per_band[band] -= cost

    def finished(self, ticket: Ticket, now: float) -> None:
        model = ticket.model
        running = self._running.get(model)
        began = running.pop(ticket.ticket_id, None) if running is not None else None
        work = self._work.pop(ticket.ticket_id, None)
        self._progress.pop(ticket.ticket_id, None)
        if began is None:
            return
        cost, _, at = began
        done, sums = self._done.get(model), self._sums.get(model)
        if done is None or sums is None:
            done, sums = self._done[model], self._sums[model] = deque(), [0.0, 0.0]
        if len(done) >= self._samples:
            old_s, old_cost = done.popleft()
            sums[0] -= old_s
            sums[1] -= old_cost
        took = max(now - at, 0.0)
        done.append((took, cost))
        sums[0] += took
        sums[1] += cost
        if work is not None:
            fit = self._fits.get(model)
            if fit is None:
                fit = self._fits[model] = WorkFit(self._samples)
            fit.add(work, took)

    def progress(self, ticket_id: int, done: float) -> None:
        """The engine's progress on a request in flight (0..1), for what it has left."""
        if ticket_id in self._work:
            self._progress[ticket_id] = min(max(done, 0.0), 1.0)

    def estimate_s(self, model: str, cost: int, work: float | None, per_cost_s: float) -> float:
        """A request's service time at `model`: the model's work fit for a request that
        states its work, else its cost at the model's seconds per cost (`per_cost_s`
        before the model has any: a slot group's other member is timed at the asker's)."""
        fit = self._fits.get(model)
        estimate = fit.estimate_s(work) if fit is not None and work is not None else None
        if estimate is not None:
            return estimate
        own = self.per_cost_s(model)
        return max(cost, 1) * (own if own is not None else per_cost_s)

    def per_cost_s(self, model: str) -> float | None:
        """Seconds a slot takes per unit of estimated cost, recently; `None` before any."""
        sums = self._sums.get(model)
        if not self._done.get(model) or sums is None or sums[1] <= 0:
            return None
        return max(sums[0], 0.0) / sums[1]

    def mean_s(self, model: str) -> float | None:
        """A request's mean service time at `model`, recently; `None` before any."""
        done, sums = self._done.get(model), self._sums.get(model)
        return max(sums[0], 0.0) / len(done) if done and sums is not None else None

    def running(self, now: float) -> list[tuple[float, float | None]]:
        """`(age, service_s)` of every request in flight (`retry_after.py`): its model's
        mean_s, or for a request that states its work, its age plus what it has left
        (`left_s`: the figure the wait forecast uses)."""
        out: list[tuple[float, float | None]] = []
        for model, requests in self._running.items():
            mean = self.mean_s(model)
            for ticket_id, (cost, _, at) in requests.items():
                age = now - at
                if ticket_id in self._work and mean is not None:
                    out.append((age, age + self._left(model, ticket_id, cost, age, 0.0)))
                else:
                    out.append((age, mean))
        return out

    def left_s(self, model: str, now: float, per_cost_s: float) -> list[float]:
        """What each of the model's requests in flight has left: its estimate (`estimate_s`)
        corrected for the time it has run and its reported progress (`work_fit`)."""
        running = self._running.get(model, {}).items()
        return [
            self._left(model, tid, cost, now - at, per_cost_s) for tid, (cost, _, at) in running
        ]

    def _left(self, model: str, ticket_id: int, cost: int, ran: float, per_cost_s: float) -> float:
        estimate = self.estimate_s(model, cost, self._work.get(ticket_id), per_cost_s)
        return remaining_s(estimate, ran, self._progress.get(ticket_id))

    def share_above(
        self, model: str, band: Band, now: float, per_cost_s: float, slots: int
    ) -> float:
        """The share of the model's slots granted over the last `window_s` to bands more
        important than `band` (a fresh runner reads low: never an inflated share)."""
        if not self._granted.get(model):
            return 0.0
        self._expire(model, now)  # then the sums are the window's: O(bands), not O(grants)
        work = sum(cost for b, cost in self._band_cost[model].items() if b > band)
        return work * per_cost_s / (self._window_s * max(slots, 1))


class DeadlineBook:
    """Waiters' deadlines, earliest first."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Ticket]] = []

    def add(self, ticket: Ticket) -> None:
        """Book the ticket's deadline, if it has one."""
        if ticket.deadline_at is not None:
            heapq.heappush(self._heap, (ticket.deadline_at, ticket.ticket_id, ticket))

    def clear(self) -> None:
        """Forget every deadline (the scheduler's, once nobody waits)."""
        self._heap.clear()

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
    return DeadlinePassed(queueWaitMs=waited_ms, deadlineMs=ticket.request.deadline_ms)


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
        slots: SlotCounts,
        *,
        fair: bool,
    ) -> None:
        self._slots = slots
        self._table = table
        self._waiting = waiting
        self._vtc = vtc
        self._service = service
        self._fair = fair

    def wait_s(self, model: str, band: Band, tenant: str, now: float) -> float | None:
        """The forecast wait of a new request of `tenant` in `band` for `model` (seconds);
        `None` when it cannot be told (unknown model; nothing measured yet and no slot free
        for it).

        A model sharing its engine process with others (`slot_groups.py`) waits for the
        group's slots: the group's waiters and requests in flight count, each timed at its
        own model's measured speed (`ServiceTimes.estimate_s`; a member with nothing
        measured yet at this model's)."""
        record = self._table.get(model)
        if record is None:
            return None
        members = self._slots.members(model)
        slots = self._slots.capacity(model)  # the model's own when it is in no group
        per_cost = self._service.per_cost_s(model)
        estimates: dict[int, float] = {}

        def note(ticket: Ticket) -> tuple[int, int]:
            if per_cost is not None:
                estimates[ticket.ticket_id] = self._service.estimate_s(
                    ticket.model, ticket.cost, ticket.request.work, per_cost
                )
            return ticket.ticket_id, ticket.cost

        higher = [
            note(t)
            for m in members
            for b in Band
            if b > band
            for q in self._waiting.band(m, b).values()
            for t in q
        ]
        tickets: dict[str, list[tuple[int, int]]] = {}
        for m in members:
            for name, fifo in self._waiting.band(m, band).items():
                tickets.setdefault(name, []).extend(note(t) for t in fifo)
        queues = {
            name: TenantQueue(self._vtc.counter(name), self._vtc.weight(name), sorted(mine))
            for name, mine in tickets.items()
        }
        if tenant not in queues:
            queues[tenant] = TenantQueue(self._lifted(tenant), self._vtc.weight(tenant), [])
        served = ahead_tickets(higher, tenant, queues, fair=self._fair)
        opens = opens_in_s(record, model in self._table.wants, now)
        if per_cost is None:
            busy = sum(len(self._service.left_s(m, now, 0.0)) for m in members)
            return opens if not served and slots - busy > 0 else None
        return forecast_wait_s(
            [estimates[ticket_id] for ticket_id, _ in served],
            slots,
            [left for m in members for left in self._service.left_s(m, now, per_cost)],
            opens,
            self._service.share_above(model, band, now, per_cost, slots),
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
