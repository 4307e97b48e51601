"""`SchedulerAdmission`: the scheduler core behind the data path's `Admission` seam.

Every event goes through `_post`, which hands it to the core at once, on the
event loop's thread: `acquire` posts `RequestArrived` and awaits a future the
core resolves through `Effects`; `release` posts `ServeDone`; one small task
posts a `Tick` every `tick_interval_s` (timeouts, aging). A request the core grants at
once while nobody waits (the common case) skips the event and the future:
`Scheduler.admit_now` makes the same decision and records and hands its ticket back
(under callgrind, 100,000 -> 85,300 instructions per acquire and release).

Why events are handled where they are posted rather than by a task draining a
queue (llama-swap's run loop): asyncio runs one callback at a time on one
thread and `Scheduler.handle` never awaits, so each event is still handled
whole, one after another, by the only code that touches the core - the same
serialization a single consumer task gives, without a lock. What the queue
would add is two event-loop hops per request on the data path (post, wake the
consumer, wake the caller); handled in place, a request granted at once never
leaves its own task. The request `Effects` only resolve futures; an event
posted while another is being handled (a model pool answering inside
`start_load`) is queued and handled right after it, so the core is never
re-entered.

The model pool plugs in as the `ModelEffects` (`models=`, given at construction)
and reports back with `model_ready`, `load_failed`, `model_stopped`,
`model_slept`, `model_crashed`; the API asks with `request_load` /
`request_unload`. Each stamps the event with the injected clock. Whoever wants to
follow the models (load tasks, unloads, metrics) subscribes to the scheduler's
`ModelNotice`s with `listen`: each is delivered at once, on the loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from faults import QuorumError
from runner.scheduler.config import ModelPolicy, SchedulerConfig
from runner.scheduler.core import Scheduler
from runner.scheduler.effects import ModelEffects, ModelNotice, PermitEffects
from runner.scheduler.errors import SchedulerError, SchedulerStopped
from runner.scheduler.events import (
    Band,
    Event,
    LoadCancellation,
    LoadFailure,
    LoadRequested,
    ModelCrashed,
    ModelReady,
    ModelSlept,
    ModelStopped,
    PermitGranted,
    RequestArrived,
    RequestCancelled,
    RunnerStopping,
    ServeDone,
    TenantsChanged,
    Tick,
    Ticket,
    UnloadRequested,
)
from runner.scheduler.grants import AdmissionRequest, Grant, Usage
from runner.scheduler.models import Gate, ModelView, unload_refusal
from runner.scheduler.stats import QueueStats

log = logging.getLogger("quorum.scheduler")


class SchedulerObserver(Protocol):
    """Metrics hooks; the runner implements them with its Prometheus metrics."""

    def on_queued(self, tenant: str, priority: str) -> None: ...

    def on_granted(self, tenant: str, priority: str, wait_s: float) -> None: ...

    def on_rejected(self, reason: str, tenant: str) -> None: ...


class NullObserver:
    def on_queued(self, tenant: str, priority: str) -> None:
        return None

    def on_granted(self, tenant: str, priority: str, wait_s: float) -> None:
        return None

    def on_rejected(self, reason: str, tenant: str) -> None:
        return None


@dataclass(slots=True)
class ScheduledGrant(Grant):
    """A grant that remembers its ticket, so `release` can find the slot."""

    ticket_id: int = -1


class NoModels:
    """`ModelEffects` while no model pool is attached: no memory, so nothing loads.

    Only reached if the config names managed models (`SchedulerConfig.models`)
    or something posts a load without a pool; attached engines never need it.
    """

    def start_load(self, model: str, policy: ModelPolicy) -> None:
        log.error("no model pool attached: cannot load %s", model)

    def stop_model(self, model: str, sleep: bool, cut: QuorumError | None = None) -> None:
        log.error("no model pool attached: cannot stop %s", model)

    def free_memory_mb(self) -> int:
        return 0

    def log_decision(self, text: str) -> None:
        log.info("%s", text)


Listener = Callable[[ModelNotice], None]


class _FutureEffects:
    """`Effects` over the callers' futures, keyed by ticket id; models go to the pool."""

    def __init__(self, observer: SchedulerObserver, models: ModelEffects) -> None:
        self.waiters: dict[int, asyncio.Future[ScheduledGrant]] = {}
        self.models = models
        self.listeners: list[Listener] = []
        self._observer = observer

    def grant(self, ticket: Ticket, queue_wait_ms: int) -> bool:
        future = self.waiters.get(ticket.ticket_id)
        if future is None or future.done():
            return False  # the caller left between its decision and this grant
        future.set_result(ScheduledGrant(ticket.request, queue_wait_ms, ticket.ticket_id))
        self._observer.on_granted(ticket.tenant, ticket.band.label, queue_wait_ms / 1000)
        return True

    def reject(self, ticket: Ticket, error: QuorumError) -> None:
        future = self.waiters.get(ticket.ticket_id)
        if future is not None and not future.done():
            future.set_exception(error)
        self._observer.on_rejected(error.code, ticket.tenant)

    def start_load(self, model: str, policy: ModelPolicy) -> None:
        self.models.start_load(model, policy)

    def stop_model(self, model: str, sleep: bool, cut: QuorumError | None = None) -> None:
        self.models.stop_model(model, sleep, cut)

    def free_memory_mb(self) -> int:
        return self.models.free_memory_mb()

    def log_decision(self, text: str) -> None:
        self.models.log_decision(text)

    def notify(self, notice: ModelNotice) -> None:
        for listener in list(self.listeners):
            try:
                listener(notice)
            except Exception:  # one listener's bug must not stop scheduling
                log.exception("model listener failed on %r", notice)


class SchedulerAdmission:
    """Queues, priorities and fair sharing behind `runner.scheduler.grants.Admission`.

    Start it inside the running event loop with `await start()`, stop it with
    `await stop()` (waiters are refused with `SchedulerStopped`).
    """

    def __init__(
        self,
        config: SchedulerConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        tick_interval_s: float = 0.1,
        observer: SchedulerObserver | None = None,
        models: ModelEffects | None = None,
        permits: PermitEffects | None = None,
    ) -> None:
        """`permits` holds the cross-replica in-flight caps (`config.shared_in_flight`)."""
        self._clock = clock
        self._tick_interval_s = tick_interval_s
        self._observer: SchedulerObserver = observer or NullObserver()
        self._effects = _FutureEffects(self._observer, models or NoModels())
        self.core = Scheduler(config, self._effects, permits=permits)
        self._ids = itertools.count(1)
        self._ticker: asyncio.Task[None] | None = None
        self._handling = False
        self._later: deque[Event] = deque()

    async def start(self) -> None:
        if self._ticker is None:
            self._ticker = asyncio.create_task(self._tick(), name="scheduler-tick")

    async def stop(self) -> None:
        """Refuse every waiter and every later request; stop the ticks."""
        if self._ticker is None:
            return
        self._post(RunnerStopping(self._clock()))
        self._ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._ticker
        self._ticker = None

    async def acquire(self, request: AdmissionRequest) -> Grant:
        """Wait for a slot; raises a `SchedulerError` if refused.

        Cancelling the awaiting coroutine withdraws the request: it is never
        granted, or, if the grant raced the cancellation, its slot is given back.
        Before `start()` or after `stop()` it raises `SchedulerStopped` at once.
        """
        if self._ticker is None:
            raise SchedulerStopped(retry_after=1)
        ticket_id = next(self._ids)
        if not self._handling:  # granted at once, nobody waiting: no event, no future
            granted = self._admit_now(ticket_id, request)
            if granted is not None:
                return granted
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ScheduledGrant] = loop.create_future()
        self._effects.waiters[ticket_id] = future
        timer: asyncio.TimerHandle | None = None
        try:
            self._post(RequestArrived(ticket_id, request, self._clock()))
            if request.deadline_ms is not None and not future.done():
                # a Tick when its deadline comes, so it leaves then, not at the next tick
                timer = loop.call_later(request.deadline_ms / 1000 + 0.001, self._tick_now)
            return await future  # already resolved when granted or refused at once
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                self._post(ServeDone(ticket_id, None, self._clock()))
            else:
                self._post(RequestCancelled(ticket_id, self._clock()))
            raise
        finally:
            del self._effects.waiters[ticket_id]
            if timer is not None:
                timer.cancel()

    def _admit_now(self, ticket_id: int, request: AdmissionRequest) -> ScheduledGrant | None:
        """`Scheduler.admit_now`: the grant of a request the core grants at once while
        nobody waits (what `RequestArrived` would decide, without it); None otherwise."""
        try:
            ticket = self.core.admit_now(ticket_id, request, self._clock())
        except Exception:  # as `_handle`: logged, and the caller refused, not left waiting
            log.exception("scheduler failed to admit %r", request)
            raise SchedulerError("internal scheduling error") from None
        if ticket is None:
            return None
        self._observer.on_granted(ticket.tenant, ticket.band.label, 0.0)
        return ScheduledGrant(request, 0, ticket_id)

    def release(self, grant: Grant, usage: Usage | None) -> None:
        """Give the slot back with the engine's usage; call once per grant."""
        if not isinstance(grant, ScheduledGrant):
            raise TypeError("release() takes a grant this admission handed out")
        self._post(ServeDone(grant.ticket_id, usage, self._clock()))

    def progress(self, grant: Grant, done: float) -> None:
        """The engine's progress on a granted request (0..1; bookkeeping only: what the
        request has left is forecast from it, `work_fit.remaining_s`)."""
        if isinstance(grant, ScheduledGrant):
            self.core.service.progress(grant.ticket_id, done)

    def queue_depth(self) -> int:
        return self.core.queue_depth()

    def stats(self) -> QueueStats:
        return self.core.stats(self._clock())

    def depth_by_priority(self) -> dict[str, int]:
        return self.core.depth_by_priority()

    # -- tenants: policies changed, permits of shared in-flight caps ------------------

    def tenants_changed(self, event: TenantsChanged) -> None:
        self._post(event)

    def permit_granted(self, tenant: str) -> None:
        self._post(PermitGranted(tenant, self._clock()))

    def tenant_in_flight(self) -> dict[str, int]:
        """Requests at the engines per tenant, on this replica."""
        return self.core.caps.by_tenant()

    # -- model lifecycle: asked by the API, answered by the pool -----------------------

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` with every `ModelNotice` from now on; returns the unsubscribe."""
        self._effects.listeners.append(listener)
        return lambda: self._effects.listeners.remove(listener)

    def check(self, model: str) -> None:
        """Raise now what a request for `model` would be refused with (`Scheduler.gate`);
        return when it would be granted or wait. Request paths ask before work that
        costs (probing an upload, accepting a job); admission decides again."""
        gate = self.core.gate(model)
        if not isinstance(gate, Gate):
            raise gate

    def check_unload(self, model: str, mode: str) -> None:
        """Raise why `model` cannot be unloaded (`mode` stop or sleep) now
        (`models.unload_refusal`); return when it can."""
        refusal = unload_refusal(model, self.core.table.get(model), mode)
        if refusal is not None:
            raise refusal

    def cancel_load(self, model: str) -> None:
        """Call off `model`'s load: its want is forgotten, or its start is stopped."""
        self._post(LoadCancellation(model, self._clock()))

    def request_load(self, model: str, policy: ModelPolicy, evict_first: str | None = None) -> None:
        """Ask for `model`; listeners hear how it goes (`ModelNotice`)."""
        self._post(LoadRequested(model, policy, evict_first, self._clock()))

    def request_unload(self, model: str, sleep: bool = False) -> None:
        """Drain and stop `model` (or put it to sleep); listeners hear it go."""
        self._post(UnloadRequested(model, self._clock(), sleep))

    def model_ready(self, model: str, concurrency: int, mem_mb: int) -> None:
        self._post(ModelReady(model, concurrency, mem_mb, self._clock()))

    def load_failed(
        self, model: str, reason: str, exit_code: int | None = None, cancelled: bool = False
    ) -> None:
        self._post(LoadFailure(model, reason, self._clock(), exit_code, cancelled))

    def model_stopped(self, model: str, freed_mb: int = 0) -> None:
        self._post(ModelStopped(model, self._clock(), freed_mb))

    def model_slept(self, model: str, mem_mb: int, freed_mb: int) -> None:
        self._post(ModelSlept(model, mem_mb, freed_mb, self._clock()))

    def model_crashed(self, model: str, reason: str, exit_code: int | None = None) -> None:
        self._post(ModelCrashed(model, reason, self._clock(), exit_code))

    def models(self) -> dict[str, ModelView]:
        return self.core.models()

    def _post(self, event: Event) -> None:
        """Handle one event now, or queue it behind the one being handled (no re-entry)."""
        if self._handling:
            self._later.append(event)
            return
        self._handling = True
        try:
            self._handle(event)
            while self._later:
                self._handle(self._later.popleft())
        finally:
            self._handling = False

    def _handle(self, event: Event) -> None:
        """Handle one event; a failing decision is logged, never raised into a caller."""
        try:
            self.core.handle(event)
            if isinstance(event, RequestArrived) and self.core.is_waiting(event.ticket_id):
                req = event.request
                self._observer.on_queued(req.tenant, Band.parse(req.priority).label)
        except Exception:  # a bug in one decision must not stop scheduling
            log.exception("scheduler failed to handle %r", event)
            if isinstance(event, RequestArrived):  # nor leave its caller waiting forever
                future = self._effects.waiters.get(event.ticket_id)
                if future is not None and not future.done():
                    future.set_exception(SchedulerError("internal scheduling error"))

    def _tick_now(self) -> None:
        self._post(Tick(self._clock()))

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self._tick_interval_s)
            self._post(Tick(self._clock()))
