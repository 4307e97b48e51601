"""The scheduler: a pure state machine over requests waiting for engine slots.

One `Scheduler` owns all scheduling state. It is fed events one at a time
(`handle`, or the `on_*` methods directly), decides, and acts only through
`Effects`. It reads no clock (every event carries its time), does no I/O,
and needs no lock: `loop.py` calls it from a single asyncio task.

Order of service when a model's slot frees:
1. priority band: high, then normal, then low (a low request waiting longer
   than `low_aging_s` is promoted to normal, so nothing starves);
2. within a band, fair share across tenants by weighted service (VTC, see
   `tenants/fairness.py`); with `fair=False`, plain arrival order;
3. FIFO within a tenant.
"""

from __future__ import annotations

from collections import Counter

from runner.scheduler.config import SchedulerConfig
from runner.scheduler.effects import Effects
from runner.scheduler.errors import (
    QueueFull,
    QueueTimeout,
    SchedulerError,
    SchedulerStopped,
    TenantQueueFull,
)
from runner.scheduler.events import (
    Band,
    Event,
    RequestArrived,
    RequestCancelled,
    ServeDone,
    Shutdown,
    Tick,
    Ticket,
)
from runner.scheduler.stats import DrainMeter, QueueStats, WaitWindow, retry_after_s
from runner.scheduler.waiting import WaitingRoom
from tenants.fairness import VirtualTokenCounter, service_cost


class Scheduler:
    def __init__(self, config: SchedulerConfig, effects: Effects, *, started_at: float) -> None:
        self.config = config
        self._effects = effects
        self._waiting = WaitingRoom()
        self._vtc = VirtualTokenCounter(config.tenant_weights, config.default_weight)
        self._in_flight: Counter[str] = Counter()
        self._serving: dict[int, Ticket] = {}
        self._waits = WaitWindow(config.stats_window_s)
        self._drain = DrainMeter(config.stats_window_s, started_at)
        self._stopped = False

    # -- events ------------------------------------------------------------------

    def handle(self, event: Event) -> None:
        match event:
            case RequestArrived():
                self.on_request(event)
            case RequestCancelled():
                self.on_cancel(event)
            case ServeDone():
                self.on_serve_done(event)
            case Tick():
                self.on_tick(event)
            case Shutdown():
                self.on_shutdown(event)

    def on_request(self, event: RequestArrived) -> None:
        """Grant, queue or refuse one arriving request.

        1. Bring the queue up to the event's time (timeouts, aging).
        2. After shutdown, refuse.
        3. A model with a free slot has nobody waiting for it: grant at once.
        4. The tenant at its queue cap: refuse with `TenantQueueFull`.
        5. The queue at `max_queue_depth`: refuse with `QueueFull`.
        6. Otherwise wait; a tenant joining the backlog gets its counter lifted.
        """
        now = event.at
        req = event.request
        ticket = Ticket(
            ticket_id=event.ticket_id,
            request=req,
            band=Band.parse(req.priority),
            cost=service_cost(req.est_input_tokens, req.est_output_tokens),
            arrived_at=now,
        )
        # 1
        self._catch_up(now)
        # 2
        if self._stopped:
            self._effects.reject(ticket, SchedulerStopped())
            return
        # 3
        if self._in_flight[ticket.model] < self.config.concurrency(ticket.model):
            self._vtc.on_backlogged(ticket.tenant, self._waiting.tenants())
            self._grant(ticket, now)
            return
        # 4
        cap = self.config.tenant_queue_cap(ticket.tenant)
        mine = self._waiting.tenant_depth(ticket.tenant)
        if cap is not None and mine >= cap:
            retry = self._retry_after(now, mine + 1)
            self._effects.reject(ticket, TenantQueueFull(ticket.tenant, mine, cap, retry))
            return
        # 5
        depth = len(self._waiting)
        if depth >= self.config.max_queue_depth:
            retry = self._retry_after(now, depth + 1)
            avg = self._waits.avg_ms(now)
            self._effects.reject(ticket, QueueFull(depth, self.config.max_queue_depth, avg, retry))
            return
        # 6
        self._vtc.on_backlogged(ticket.tenant, self._waiting.tenants())
        self._waiting.add(ticket)

    def on_cancel(self, event: RequestCancelled) -> None:
        """Withdraw a caller that went away.

        1. Still waiting: removed, it will never be granted.
        2. Otherwise (in flight, already ended, unknown): nothing; a request in
           flight ends with its `ServeDone`.
        """
        self._catch_up(event.at)
        ticket = self._waiting.remove(event.ticket_id)
        if ticket is not None:
            self._left_queue(ticket)

    def on_serve_done(self, event: ServeDone) -> None:
        """A granted request finished at the engine.

        1. Not in flight (unknown, or already done): ignore, so counts never go negative.
        2. Free its slot and count the drain.
        3. Correct the tenant's service with the usage the engine reported.
        4. Hand the freed slot to the next waiter.
        """
        self._catch_up(event.at)
        # 1
        ticket = self._serving.pop(event.ticket_id, None)
        if ticket is None:
            return
        # 2
        self._in_flight[ticket.model] -= 1
        if self._in_flight[ticket.model] <= 0:
            del self._in_flight[ticket.model]
        self._drain.record(event.at)
        # 3
        if event.usage is not None:
            actual = service_cost(event.usage.input_tokens, event.usage.output_tokens)
            self._vtc.correct(ticket.tenant, ticket.cost, actual)
        # 4
        self._dispatch(ticket.model, event.at)

    def on_tick(self, event: Tick) -> None:
        """Time passed: time out and promote waiters (see `_catch_up`)."""
        self._catch_up(event.at)

    def on_shutdown(self, event: Shutdown) -> None:
        """Refuse every waiter and every later arrival; in-flight requests run out."""
        self._stopped = True
        for ticket in self._waiting:
            self._drop(ticket, SchedulerStopped())

    # -- queries (read-only; safe to call between events) --------------------------

    def queue_depth(self) -> int:
        return len(self._waiting)

    def in_flight(self, model: str) -> int:
        return self._in_flight[model]

    def is_waiting(self, ticket_id: int) -> bool:
        return ticket_id in self._waiting

    def waiting_tenants(self) -> set[str]:
        """Tenants with at least one request waiting (the backlog)."""
        return set(self._waiting.tenants())

    def counter(self, tenant: str) -> float:
        """The tenant's VTC counter (weighted service received, per unit of weight)."""
        return self._vtc.counter(tenant)

    def stats(self, now: float) -> QueueStats:
        return QueueStats(
            depth=len(self._waiting),
            max_depth=self.config.max_queue_depth,
            depth_by_priority={b.label: self._waiting.band_depth(b) for b in Band},
            avg_wait_ms=self._waits.avg_ms(now),
            p95_wait_ms=self._waits.p95_ms(now),
            drain_per_s=self._drain.rate(now),
            in_flight=dict(self._in_flight),
        )

    def retry_after_s(self, now: float) -> int:
        """What a refusal would say right now, for a request joining the back of the queue."""
        return self._retry_after(now, len(self._waiting) + 1)

    # -- decisions ---------------------------------------------------------------

    def _catch_up(self, now: float) -> None:
        """Bring the queue up to `now`.

        1. Waiters older than the queue timeout are refused with `QueueTimeout`.
        2. Low waiters older than the aging age move to normal.
        """
        # 1
        timeout = self.config.queue_timeout_s
        if timeout is not None:
            for ticket in self._waiting.overdue(now, timeout):
                waited_ms = round(1000 * (now - ticket.arrived_at))
                retry = self._retry_after(now, len(self._waiting))
                self._drop(ticket, QueueTimeout(waited_ms, round(1000 * timeout), retry))
        # 2
        if self.config.low_aging_s is not None and self._waiting.band_depth(Band.LOW):
            self._waiting.promote_low(now, self.config.low_aging_s)

    def _dispatch(self, model: str, now: float) -> None:
        """Fill the model's free slots from its waiters, in service order."""
        while self._in_flight[model] < self.config.concurrency(model):
            ticket = self._waiting.take(model, self._choose)
            if ticket is None:
                return
            self._left_queue(ticket)
            self._grant(ticket, now)

    def _choose(self, heads: list[Ticket]) -> Ticket:
        """Among tenants' heads (oldest first): least served tenant, or the oldest if not fair."""
        if not self.config.fair:
            return heads[0]
        tenant = self._vtc.pick(head.tenant for head in heads)
        return next(head for head in heads if head.tenant == tenant)

    def _grant(self, ticket: Ticket, now: float) -> None:
        """Hand the slot over; count and charge it only if a live caller took it."""
        wait_s = now - ticket.arrived_at
        if not self._effects.grant(ticket, round(1000 * wait_s)):
            return
        self._in_flight[ticket.model] += 1
        self._serving[ticket.ticket_id] = ticket
        self._vtc.charge(ticket.tenant, ticket.cost)
        self._waits.record(now, wait_s)

    def _drop(self, ticket: Ticket, error: SchedulerError) -> None:
        self._waiting.remove(ticket.ticket_id)
        self._left_queue(ticket)
        self._effects.reject(ticket, error)

    def _left_queue(self, ticket: Ticket) -> None:
        if not self._waiting.tenant_depth(ticket.tenant):
            self._vtc.on_idle(ticket.tenant)

    def _retry_after(self, now: float, position: int) -> int:
        fallback = self.config.queue_timeout_s or 30.0
        return retry_after_s(position, self._drain.rate(now), fallback)
