"""The scheduler: one pure state machine over requests and the models they need.

One `Scheduler` owns all scheduling state. It is fed events one at a time (`handle`;
`admit_now`, a request granted at once, without the event), decides, and acts only
through `Effects`. It reads no clock (every event carries its time), does no I/O, and
needs no lock: `admission.py` calls it from the event loop's one thread.

It is one class by composition: this file holds the request half (waiting room,
fair-share counters, wait statistics) and the request events; `slot_groups.SlotCounts`
counts requests in flight per model and per engine process (models sharing one, as
ComfyUI's do, share its slots); `models.ModelTable` holds each model's record and
`models.admission` decides what a request for it meets; `lifecycle.ModelLifecycle`
handles the model events and `swaps.Swaps` plans loads, swaps, drains, keep-alive and
restarts. Both reach the request half only through the `swaps.Requests` methods below.

Order of service when a slot frees (in the model's slot group):
1. priority band: high, then normal, then low (a low request waiting longer
   than `low_aging_s` is promoted to normal, so nothing starves);
2. within a band, fair share across tenants by weighted service (VTC, see
   `tenants/fairness.py`); with `fair=False`, plain arrival order;
3. FIFO within a tenant.

A tenant at its in-flight cap (`max_in_flight`) is passed over: its waiters keep their
place (`tenant_caps.TenantCaps` counts, asks for cross-replica permits and applies
policy changes; it reaches this half through `dispatch_tenant` and `tenant_depth`).
"""

from __future__ import annotations

from faults import QuorumError
from runner.scheduler.config import SchedulerConfig
from runner.scheduler.deadlines import DeadlineBook, Outlook, ServiceTimes, deadline_exceeded
from runner.scheduler.effects import Effects, PermitEffects
from runner.scheduler.errors import SchedulerError, SchedulerStopped
from runner.scheduler.events import (
    Band,
    Event,
    PermitGranted,
    RequestArrived,
    RequestCancelled,
    RunnerStopping,
    ServeDone,
    TenantsChanged,
    Tick,
    Ticket,
)
from runner.scheduler.grants import AdmissionRequest
from runner.scheduler.lifecycle import ModelLifecycle
from runner.scheduler.models import Gate, ModelTable, ModelView
from runner.scheduler.refusals import queue_timeout, wait_refusal
from runner.scheduler.retry_after import PromisedReturns, retry_after_s
from runner.scheduler.slot_groups import SlotCounts, next_ticket
from runner.scheduler.stats import QueueStats, WaitWindow
from runner.scheduler.swaps import Swaps
from runner.scheduler.tenant_caps import TenantCaps
from runner.scheduler.waiting import WaitingRoom
from tenants.fairness import VirtualTokenCounter, service_cost


class Scheduler:
    """The whole state machine; see the module docstring."""

    def __init__(
        self,
        config: SchedulerConfig,
        effects: Effects,
        *,
        permits: PermitEffects | None = None,
    ) -> None:
        self.config = config
        self._effects = effects
        self.caps = TenantCaps(config, permits, self)
        self._waiting = WaitingRoom()
        self._vtc = VirtualTokenCounter(config.tenant_weights, config.default_weight)
        self._serving: dict[int, Ticket] = {}
        self._waits = WaitWindow(config.stats_window_s)
        self._returns = PromisedReturns()  # refused clients due back (`retry_after.py`)
        self.service = ServiceTimes()
        self._deadlines = DeadlineBook()
        self.table = ModelTable(config)
        self.slots = SlotCounts(config, self.table)
        self.outlook = Outlook(
            self.table, self._waiting, self._vtc, self.service, self.slots, fair=config.fair
        )
        self.swaps = Swaps(config, self.table, self, effects)
        self.lifecycle = ModelLifecycle(config, self.table, self.swaps, self, effects)
        # what the model table answers (read-only; safe to call between events)
        self.gate, self.status = self.table.gate, self.table.status
        self.loading, self.wanted = self.table.loading, self.table.wanted

    # -- events ------------------------------------------------------------------

    def handle(self, event: Event) -> None:
        if self._waiting:
            self._catch_up(event.at)
        else:  # nobody waits (the common case): nothing can be due, time out or age; the
            self._deadlines.clear()  # deadlines booked are all of tickets that left
        match event:
            case RequestArrived():
                self.on_request(event)
            case RequestCancelled():
                self.on_cancel(event)
            case ServeDone():
                self.on_serve_done(event)
            case Tick():
                self.on_tick(event)
            case RunnerStopping():
                self.on_shutdown(event)
            case TenantsChanged():
                self.on_tenants_changed(event)
            case PermitGranted():
                self.caps.on_permit(event.tenant, event.at)
            case _:  # a model event
                self.lifecycle.handle(event)

    def on_request(self, event: RequestArrived) -> None:
        """Grant, queue or refuse one arriving request.

        1. After shutdown, refuse.
        2. By its model (`models.admission`): refused (unknown, not loaded, unloading,
           failed); open with a free slot, its own and its slot group's
           (`slot_groups.py`; so nobody waits for it), its tenant below its in-flight cap
           (`tenant_caps.TenantCaps.eligible`): granted at once.
           Otherwise (full, loading, wanted, restarting, coming back) it may wait.
        3. The tenant at its queue cap: refuse with `TenantQueueFull`.
        4. The queue at `max_queue_depth`: refuse with `QueueFull`.
        5. A deadline the forecast wait exceeds (`deadlines.deadline_refusal`): refuse
           with `DeadlineUnreachable`, the forecast and `Retry-After`.
        6. Otherwise wait (until its deadline, if it has one); a tenant joining the
           backlog gets its counter lifted; a capped tenant without a permit asks for one
           (shared caps). An `autoload` model that is not resident is now wanted: plan
           its load.
        """
        now = event.at
        ticket = Ticket.of(event.ticket_id, event.request, now)
        model = ticket.model
        if self.swaps.stopped:  # 1
            self._effects.reject(ticket, SchedulerStopped(retry_after=1))
            return
        gate = self.gate(model)  # 2
        if not isinstance(gate, Gate):
            self._effects.reject(ticket, gate)
            return
        if gate is Gate.OPEN and self.slots.has_room(model) and self.caps.eligible(ticket.tenant):
            self._vtc.on_backlogged(ticket.tenant, self._waiting.tenants())
            self._grant(ticket, now)
            return
        refusal = wait_refusal(  # 3, 4, 5
            ticket,
            self.config,
            self._waiting,
            forecast_s=lambda: self.outlook.wait_s(model, ticket.band, ticket.tenant, now),
            avg_wait_ms=lambda: self._waits.avg_ms(now),
            retry_after=lambda: self._retry_after(now),
        )
        if refusal is not None:
            self._effects.reject(ticket, refusal)
            return
        self._vtc.on_backlogged(ticket.tenant, self._waiting.tenants())  # 6
        self._waiting.add(ticket)
        self._deadlines.add(ticket)
        self.caps.want(ticket.tenant)
        if gate is Gate.AUTOLOAD:
            record = self.table.records[model]
            self.swaps.want(model, record.policy, None, now, governed=False)
        if gate is not Gate.OPEN:
            self.swaps.advance(now)

    def admit_now(self, ticket_id: int, request: AdmissionRequest, now: float) -> Ticket | None:
        """`handle(RequestArrived(...))` where nobody waits and it is granted at once: the
        same records, the ticket returned, not granted through `Effects`; else None,
        nothing changed (then post the event)."""
        model = request.model
        if self._waiting or self.swaps.stopped or self.gate(model) is not Gate.OPEN:
            return None
        if not self.slots.has_room(model) or not self.caps.eligible(request.tenant):
            return None
        self._deadlines.clear()  # `handle`'s, with nobody waiting
        ticket = Ticket.of(ticket_id, request, now)
        self._vtc.on_backlogged(ticket.tenant, ())  # (no backlog)
        self._started(ticket, now, 0.0)
        return ticket

    def on_cancel(self, event: RequestCancelled) -> None:
        """Withdraw a caller that went away.

        1. Still waiting: removed, it will never be granted.
        2. Otherwise (in flight, already ended, unknown): nothing; a request in
           flight ends with its `ServeDone`.
        """
        ticket = self._waiting.remove(event.ticket_id)
        if ticket is not None:
            self._left_queue(ticket)
            self.caps.trim(ticket.tenant)

    def on_serve_done(self, event: ServeDone) -> None:
        """A granted request finished at the engine.

        1. Not in flight (unknown, or already done): ignore, so counts never go negative.
        2. Free its slot and mark the model used.
        3. Correct the tenant's service with the usage the engine reported.
        4. Hand the freed slot to the next waiter of its slot group.
        5. Move model lifecycles on (a draining model may now be stopped).
        """
        now = event.at
        ticket = self._serving.pop(event.ticket_id, None)  # 1
        if ticket is None:
            return
        model = ticket.model  # 2
        self.slots.finished(model)
        capped = self.caps.finished(ticket.tenant)
        self.service.finished(ticket, now)
        self._touch(model, now)
        if event.usage is not None:  # 3
            actual = service_cost(event.usage.input_tokens, event.usage.output_tokens)
            self._vtc.correct(ticket.tenant, ticket.cost, actual)
        self.dispatch(model, now)  # 4
        if capped:  # its waiters for other models may go now
            self.caps.may_go(ticket.tenant, now)
        self.swaps.advance(now)  # 5

    def on_tenants_changed(self, event: TenantsChanged) -> None:
        """New tenant policies: weights, queue caps and in-flight caps from now on; a
        raised cap lets waiters go at once. Requests in flight and their tickets keep
        what they were admitted with."""
        self.config = self.caps.changed(self.config, event)
        self._vtc.set_weights(event.tenant_weights, event.default_weight)
        for tenant in list(self._waiting.tenants()):
            self.caps.may_go(tenant, event.at)

    def dispatch_tenant(self, tenant: str, now: float) -> None:
        """Dispatch every model `tenant` has a waiter for (it may have become eligible)."""
        for model in self._waiting.models_of(tenant):
            self.dispatch(model, now)

    def tenant_depth(self, tenant: str) -> int:
        return self._waiting.tenant_depth(tenant)

    def on_tick(self, event: Tick) -> None:
        """Time passed: time out and promote waiters (done on every event), expire
        keep-alives, start due restarts, move lifecycles on."""
        self.swaps.keep_alive(event.at)
        self.swaps.advance(event.at)

    def on_shutdown(self, event: RunnerStopping) -> None:
        """Refuse every waiter and every later arrival; in-flight requests run out.

        Wanted loads are dropped; the pool tears the engines down itself.
        """
        self.swaps.stop()
        for ticket in self._waiting:
            self._drop(ticket, SchedulerStopped(retry_after=1))

    # -- queries (read-only; safe to call between events) --------------------------

    def queue_depth(self) -> int:
        return len(self._waiting)

    def in_flight(self, model: str) -> int:
        return self.slots.by_model[model]

    def waiting(self, model: str) -> int:
        return self._waiting.model_depth(model)

    def top_band(self, model: str) -> Band | None:
        return self._waiting.top_band(model)

    def is_waiting(self, ticket_id: int) -> bool:
        return ticket_id in self._waiting

    def waiting_tickets(self) -> list[Ticket]:
        """Every request waiting now (who, which band, which model), oldest first."""
        return sorted(self._waiting, key=lambda ticket: ticket.ticket_id)

    def waiting_tenants(self) -> set[str]:
        """Tenants with at least one request waiting (the backlog)."""
        return set(self._waiting.tenants())

    def counter(self, tenant: str) -> float:
        """The tenant's VTC counter (weighted service received, per unit of weight)."""
        return self._vtc.counter(tenant)

    def depth_by_priority(self) -> dict[str, int]:
        """Requests waiting per priority band (cheap: no wait statistics)."""
        return {b.label: self._waiting.band_depth(b) for b in Band}

    def stats(self, now: float) -> QueueStats:
        return QueueStats(
            depth=len(self._waiting),
            max_depth=self.config.max_queue_depth,
            depth_by_priority=self.depth_by_priority(),
            avg_wait_ms=self._waits.avg_ms(now),
            p95_wait_ms=self._waits.p95_ms(now),
            in_flight=dict(self.slots.by_model),
            forecast_by_model=self.outlook.by_model(now, list(self.table.records)),
        )

    def retry_after_s(self, now: float) -> int:
        """What a refusal would say right now (`retry_after.py`), promising nothing."""
        return retry_after_s(self.service.running(now), self._returns.pending(now))

    def models(self) -> dict[str, ModelView]:
        """Every model the scheduler knows, as the rest of the runner reads it."""
        return {
            model: record.view(model, self.slots.by_model[model], self._waiting.model_depth(model))
            for model, record in self.table.records.items()
        }

    # -- the request half, also used by the model half (`swaps.Requests`) ------------

    def dispatch(self, model: str, now: float) -> None:
        """Fill the free slots of `model`'s slot group (`slot_groups.py`) from its waiters.

        1. Candidates: the group's members that are open with a slot of their own.
        2. The next waiter among them (`slot_groups.next_ticket`: band, then fair share)
           is granted; again until the group is full or nobody of them waits.
        """
        while self._waiting:  # nobody waits: nothing to hand out (the common case)
            members = self.slots.members(model)  # 1
            ready = [m for m in members if self.gate(m) is Gate.OPEN and self.slots.has_room(m)]
            ticket = next_ticket(ready, self._waiting, self._choose, self.caps.eligible)  # 2
            if ticket is None:
                return
            self._waiting.remove(ticket.ticket_id)
            self._left_queue(ticket)
            self._grant(ticket, now)

    def reject_waiters(self, model: str, error: SchedulerError) -> None:
        for ticket in self._waiting.for_model(model):
            self._drop(ticket, error)

    # -- decisions ---------------------------------------------------------------

    def _catch_up(self, now: float) -> None:
        """Bring the queue up to `now` (every event does, first, while anybody waits).

        1. Waiters whose deadline has come leave with `DeadlinePassed` (504).
        2. Waiters older than the queue timeout are refused with `QueueTimeout`.
        3. Low waiters older than the aging age move to normal.
        """
        for late in self._deadlines.due(now):  # 1
            if late.ticket_id in self._waiting:
                self._drop(late, deadline_exceeded(late, now))
        timeout = self.config.queue_timeout_s  # 2
        if timeout is not None:
            for ticket in self._waiting.overdue(now, timeout):
                self._drop(ticket, queue_timeout(ticket, now, timeout, self._retry_after(now)))
        if self.config.low_aging_s is not None and self._waiting.band_depth(Band.LOW):  # 3
            self._waiting.promote_low(now, self.config.low_aging_s)

    def _touch(self, model: str, now: float) -> None:
        record = self.table.records.get(model)
        if record is not None:
            record.last_used = now

    def _choose(self, heads: list[Ticket]) -> Ticket:
        """Among tenants' heads (oldest first): least served tenant, or the oldest if not fair."""
        if not self.config.fair:
            return heads[0]
        tenant = self._vtc.pick(head.tenant for head in heads)
        return next(head for head in heads if head.tenant == tenant)

    def _grant(self, ticket: Ticket, now: float) -> None:
        """Hand the slot over; count and charge it only if a live caller took it."""
        wait_s = now - ticket.arrived_at
        if self._effects.grant(ticket, round(1000 * wait_s)):
            self._started(ticket, now, wait_s)

    def _started(self, ticket: Ticket, now: float, wait_s: float) -> None:
        """Count and charge a request the engine now has (`_grant`, `admit_now`)."""
        self.slots.started(ticket.model)
        self.caps.started(ticket.tenant)
        self._serving[ticket.ticket_id] = ticket
        self.service.started(ticket, now)
        self._vtc.charge(ticket.tenant, ticket.cost)
        self._waits.record(now, wait_s)
        self._touch(ticket.model, now)

    def _drop(self, ticket: Ticket, error: QuorumError) -> None:
        self._waiting.remove(ticket.ticket_id)
        self._left_queue(ticket)
        self.caps.trim(ticket.tenant)
        self._effects.reject(ticket, error)

    def _left_queue(self, ticket: Ticket) -> None:
        if not self._waiting.tenant_depth(ticket.tenant):
            self._vtc.on_idle(ticket.tenant)

    def _retry_after(self, now: float) -> int:
        """`Retry-After` for a client refused now (`retry_after.py`); its return is due."""
        seconds = self.retry_after_s(now)
        self._returns.promise(now + seconds)
        return seconds
