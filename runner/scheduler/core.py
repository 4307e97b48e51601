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

Models are either always ready (attached engines: `model_concurrency`) or
managed: loaded, evicted and unloaded by the pool on the scheduler's word
(`lifecycle.py` holds that half: `Lifecycle`, which this class extends).
"""

from __future__ import annotations

from runner.scheduler.errors import (
    ModelNotLoaded,
    ModelUnloading,
    QueueFull,
    QueueTimeout,
    SchedulerError,
    SchedulerStopped,
    TenantQueueFull,
)
from runner.scheduler.events import (
    Band,
    Event,
    LoadFailed,
    LoadRequested,
    ModelCrashed,
    ModelReady,
    ModelStopped,
    RequestArrived,
    RequestCancelled,
    ServeDone,
    Shutdown,
    Tick,
    Ticket,
    UnloadRequested,
)
from runner.scheduler.eviction import Phase
from runner.scheduler.lifecycle import Lifecycle
from runner.scheduler.residency import Gate, Residency
from runner.scheduler.stats import QueueStats, retry_after_s
from tenants.fairness import service_cost


class Scheduler(Lifecycle):
    """The whole state machine: `Lifecycle`'s state and model events, and the request events."""

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
            case LoadRequested():
                self.on_load_requested(event)
            case ModelReady():
                self.on_model_ready(event)
            case LoadFailed():
                self.on_load_failed(event)
            case UnloadRequested():
                self.on_unload_requested(event)
            case ModelStopped():
                self.on_model_stopped(event)
            case ModelCrashed():
                self.on_model_crashed(event)
            case Shutdown():
                self.on_shutdown(event)

    def on_request(self, event: RequestArrived) -> None:
        """Grant, queue or refuse one arriving request.

        1. Bring the queue up to the event's time (timeouts, aging).
        2. After shutdown, refuse.
        3. By the model's state: not loaded (and not `autoload`): refuse with
           `ModelNotLoaded`; being unloaded: refuse with `ModelUnloading`; ready
           with a free slot (so nobody waits for it): grant at once. Otherwise
           (full, loading, being swapped in or out) it may wait.
        4. The tenant at its queue cap: refuse with `TenantQueueFull`.
        5. The queue at `max_queue_depth`: refuse with `QueueFull`.
        6. Otherwise wait; a tenant joining the backlog gets its counter lifted.
           An `autoload` model that is not resident is now wanted: plan its load.
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
        model = ticket.model
        # 1
        self._catch_up(now)
        # 2
        if self._stopped:
            self._effects.reject(ticket, SchedulerStopped(retry_after=1))
            return
        # 3
        gate = self._gate(model)
        if gate is Gate.ABSENT:
            self._effects.reject(ticket, ModelNotLoaded(model=model))
            return
        if gate is Gate.UNLOADING:
            self._effects.reject(ticket, ModelUnloading(model=model, reason="it is being unloaded"))
            return
        if gate is Gate.OPEN and self._in_flight[model] < self._concurrency(model):
            self._vtc.on_backlogged(ticket.tenant, self._waiting.tenants())
            self._grant(ticket, now)
            return
        # 4
        cap = self.config.tenant_queue_cap(ticket.tenant)
        mine = self._waiting.tenant_depth(ticket.tenant)
        if cap is not None and mine >= cap:
            retry = self._retry_after(now, mine + 1)
            self._effects.reject(
                ticket,
                TenantQueueFull(
                    tenant=ticket.tenant,
                    tenantQueueDepth=mine,
                    tenantMaxDepth=cap,
                    retry_after=retry,
                ),
            )
            return
        # 5
        depth = len(self._waiting)
        if depth >= self.config.max_queue_depth:
            retry = self._retry_after(now, depth + 1)
            avg = self._waits.avg_ms(now)
            self._effects.reject(
                ticket,
                QueueFull(
                    queueDepth=depth,
                    maxDepth=self.config.max_queue_depth,
                    avgWaitMs=avg,
                    retry_after=retry,
                ),
            )
            return
        # 6
        self._vtc.on_backlogged(ticket.tenant, self._waiting.tenants())
        self._waiting.add(ticket)
        if gate is Gate.AUTOLOAD:
            self._want(model, self._policies[model], None, now, governed=False)
        if gate is not Gate.OPEN:
            self._advance(now)

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
        2. Free its slot, count the drain, and mark the model used.
        3. Correct the tenant's service with the usage the engine reported.
        4. Hand the freed slot to the next waiter.
        5. Move model lifecycles on (a draining model may now be stopped).
        """
        now = event.at
        self._catch_up(now)
        # 1
        ticket = self._serving.pop(event.ticket_id, None)
        if ticket is None:
            return
        # 2
        model = ticket.model
        self._in_flight[model] -= 1
        if self._in_flight[model] <= 0:
            del self._in_flight[model]
        self._drain.record(now)
        self._touch(model, now)
        # 3
        if event.usage is not None:
            actual = service_cost(event.usage.input_tokens, event.usage.output_tokens)
            self._vtc.correct(ticket.tenant, ticket.cost, actual)
        # 4
        self._dispatch(model, now)
        # 5
        self._advance(now)

    def on_tick(self, event: Tick) -> None:
        """Time passed: time out and promote waiters, expire keep-alives, move lifecycles on."""
        self._catch_up(event.at)
        self._keep_alive(event.at)
        self._advance(event.at)

    def on_shutdown(self, event: Shutdown) -> None:
        """Refuse every waiter and every later arrival; in-flight requests run out.

        Wanted loads are dropped; the pool tears the engines down itself.
        """
        self._stopped = True
        self._wants.clear()
        for ticket in self._waiting:
            self._drop(ticket, SchedulerStopped(retry_after=1))

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

    def resident(self) -> dict[str, Residency]:
        """Every managed model holding memory (loading, ready, draining, stopping)."""
        return {
            model: slot.view(model, self._in_flight[model], self._waiting.model_depth(model))
            for model, slot in self._slots.items()
        }

    def loading(self) -> list[str]:
        return [m for m, slot in self._slots.items() if slot.phase is Phase.LOADING]

    def wanted(self) -> dict[str, tuple[str, ...]]:
        """Models waiting for memory to load, with the victims chosen for each (in plan order)."""
        return {w.model: w.victims for w in self._ordered_wants()}

    def status(self, model: str) -> str:
        """`ready` | `loading` | `draining` | `stopping` | `queued` (wanted) | `absent`."""
        slot = self._slots.get(model)
        if slot is not None:
            return slot.phase.value
        if model in self._wants:
            return "queued"
        return "ready" if self._always_ready(model) else "absent"

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
                self._drop(
                    ticket,
                    QueueTimeout(
                        queueWaitMs=waited_ms,
                        queueTimeoutMs=round(1000 * timeout),
                        retry_after=retry,
                    ),
                )
        # 2
        if self.config.low_aging_s is not None and self._waiting.band_depth(Band.LOW):
            self._waiting.promote_low(now, self.config.low_aging_s)

    def _gate(self, model: str) -> Gate:
        slot = self._slots.get(model)
        if slot is None:
            if model in self._wants:
                return Gate.QUEUE
            if self._always_ready(model):
                return Gate.OPEN
            policy = self._policies.get(model)
            return Gate.AUTOLOAD if policy is not None and policy.autoload else Gate.ABSENT
        if slot.unloading:
            return Gate.UNLOADING
        if slot.phase is Phase.READY:
            return Gate.OPEN
        if slot.phase is Phase.LOADING or slot.policy.autoload or model in self._wants:
            return Gate.QUEUE
        return Gate.UNLOADING  # evicted, and it does not come back on demand

    def _concurrency(self, model: str) -> int:
        slot = self._slots.get(model)
        return self.config.concurrency(model) if slot is None else slot.concurrency

    def _touch(self, model: str, now: float) -> None:
        slot = self._slots.get(model)
        if slot is not None:
            slot.last_used = now

    def _dispatch(self, model: str, now: float) -> None:
        """Fill an open model's free slots from its waiters, in service order."""
        if self._gate(model) is not Gate.OPEN:
            return
        while self._in_flight[model] < self._concurrency(model):
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
        self._touch(ticket.model, now)

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
