"""The scheduler's model half, forward in time: wanted loads, swaps, drains, keep-alive,
restarts.

A model is wanted (`Want`) when a governed load, an `autoload` request or a due
restart asks for it. Memory is planned by the pure `eviction.plan`; one swap is
prepared at a time, and none while a load is in progress (`plan` step 5):

- the victims are committed (logged once): a victim with requests waiting keeps
  serving them (batching, llama-swap #612) for as long as its last load took,
  never longer than `swap_max_wait_s`, then takes no more and drains; an idle
  one drains at once. Why its load time: evicting it now costs the requests
  waiting for it a reload of that length (and one more load); serving them
  costs the target's waiters the time spent. Waiting as long as the reload
  would take, then evicting, is the ski-rental rule (in that model, never more
  than twice the cost of the better choice made with hindsight). A model never
  loaded by the scheduler batches for `swap_max_wait_s`;
- a drained victim is stopped (`stop_model`); only when every victim is gone
  (`ModelStopped`) is the target planned again, and then it fits: `start_load`.

Requests for the target wait in the queue all along; the cold load counts against
their queue timeout.
"""

from __future__ import annotations

from typing import Protocol

from runner.scheduler.config import ModelPolicy, SchedulerConfig
from runner.scheduler.effects import Effects, ModelNotice
from runner.scheduler.errors import ModelDoesNotFit, SchedulerError
from runner.scheduler.events import Band
from runner.scheduler.eviction import Evict, Fits, Impossible, Incoming, Resident, Wait, plan
from runner.scheduler.models import (
    LEAVING,
    ModelRecord,
    ModelState,
    ModelTable,
    Want,
    cut_short,
)

_READY, _ASLEEP = ModelState.READY, ModelState.SLEEPING


class Requests(Protocol):
    """What the model half asks of the request half (`core.Scheduler`)."""

    def in_flight(self, model: str) -> int: ...

    def waiting(self, model: str) -> int: ...

    def top_band(self, model: str) -> Band | None: ...

    def dispatch(self, model: str, now: float) -> None: ...

    def reject_waiters(self, model: str, error: SchedulerError) -> None: ...


class Swaps:
    """Plans wanted loads and moves draining, idle and crashed models on."""

    def __init__(
        self, config: SchedulerConfig, table: ModelTable, requests: Requests, effects: Effects
    ) -> None:
        self.config = config
        self.table = table
        self.requests = requests
        self.effects = effects
        self.stopped = False

    def stop(self) -> None:
        """The runner is stopping: no more loads; the wanted ones are dropped (a governed
        one is told it was refused)."""
        self.stopped = True
        for model, want in list(self.table.wants.items()):
            del self.table.wants[model]
            if want.governed:
                record = self.table.records[model]
                self.notify(model, record, refused="the runner is shutting down")

    def notify(self, model: str, record: ModelRecord, **extra: object) -> None:
        """Tell listeners what `model` is now (`ModelNotice`)."""
        view = record.view(model, self.requests.in_flight(model), self.requests.waiting(model))
        refused = extra.get("refused")
        freed = extra.get("freed_mb")
        self.effects.notify(
            ModelNotice(
                view,
                refused if isinstance(refused, str) else None,
                freed if isinstance(freed, int) else None,
            )
        )

    def want(
        self, model: str, policy: ModelPolicy, evict_first: str | None, now: float, governed: bool
    ) -> None:
        want = self.table.wants.get(model)
        if want is None:
            self.table.wants[model] = Want(model, policy, evict_first, now, governed)
            return
        want.policy = policy
        want.governed = want.governed or governed
        want.evict_first = evict_first or want.evict_first

    def drop_want(self, model: str) -> None:
        """Forget a want; victims still in their batch window go back to normal."""
        want = self.table.wants.pop(model)
        for victim in want.victims:
            record = self.table.records.get(victim)
            if (
                record is not None
                and record.state in (_READY, _ASLEEP)
                and record.evict_for == model
            ):
                record.evict_for = None

    def advance(self, now: float) -> None:
        """Move the models' lives forward.

        1. Restarts that are due become wants.
        2. Plan the wanted loads (`plan_wants`).
        3. Victims whose batch is over (the window passed, or nobody waits for
           them) take no more requests: they drain.
        4. Draining models with nothing in flight, or past their drain timeout,
           are stopped (or put to sleep: `stop_model`); past it, the requests still in
           flight are answered `models.cut_short` (503 `model_unloading`, saying why).
        """
        records = self.table.records
        # 1
        for model, record in records.items():
            due = record.restart_at
            if record.state is ModelState.FAILED and due is not None and now >= due:
                record.restart_at = None
                record.restarts += 1
                self.want(model, record.policy, None, now, governed=True)
        # 2
        if self.table.wants:
            self.plan_wants(now)
        # 3, 4
        for model, record in records.items():
            if record.evict_for is not None and record.state in (_READY, _ASLEEP):
                over = now >= record.close_at or not self.requests.waiting(model)
                if record.state is _ASLEEP or over:
                    record.sleep = False  # an evicted model is stopped, never put to sleep
                    record.drain(model, now, self.config.drain_timeout_s)
                    self.notify(model, record)
            if record.state is not ModelState.DRAINING:
                continue
            left = self.requests.in_flight(model)
            if left and now < record.drain_until:
                continue
            cut = cut_short(model, record) if left else None
            if left:
                self.effects.log_decision(f"stop {model}: drain timeout, {left} still in flight")
            record.move(model, ModelState.STOPPING, now)
            self.notify(model, record)
            self.effects.stop_model(model, record.sleep, cut)

    def plan_wants(self, now: float) -> None:
        """Start, or make room for, the wanted loads; one swap is prepared at a time.

        1. Nothing is planned after shutdown. An autoload want nobody waits for
           any more is dropped.
        2. Wants are taken in order: the one whose victims are chosen first, then
           by the best band waiting for it, then the oldest.
        3. A want whose model is still on its way out waits for it to go.
        4. A want whose victims are still resident waits for them: stop here.
        5. Otherwise plan it against the models holding memory and the memory free
           now (the pool's measure minus the loads in progress); a sleeping model
           needs only what it does not hold already:
           - Fits: reserve its memory and `start_load`; go on to the next;
           - Evict: commit the victims (logged once) and stop here;
           - Wait: room is coming (models leaving or loading): stop here;
           - Impossible: refuse it (listeners are told why; its waiters get
             `ModelDoesNotFit`) and go on.
        """
        # 1
        if self.stopped:
            return
        for want in list(self.table.wants.values()):
            if not want.governed and not self.requests.waiting(want.model):
                self.drop_want(want.model)
        # 2
        for want in self._ordered_wants():
            model = want.model
            record = self.table.add(model, want.policy)
            # 3
            if record.state in (ModelState.LOADING, ModelState.READY, *LEAVING):
                continue
            # 4
            if any(self._resident(v) for v in want.victims):
                return
            # 5
            free = self.effects.free_memory_mb() - self.table.reserved_mb()
            held = record.mem_mb if record.state is ModelState.SLEEPING else 0
            target = Incoming(model, max(0, want.policy.mem_mb - held), want.policy.priority)
            residents = [self._resident_view(m, r) for m, r in self.table.holding().items()]
            decision = plan(target, residents, free, want.evict_first)
            match decision:
                case Fits():
                    self._start_load(want, record, now, f"({target.mem_mb} MB): {free} MB free")
                case Evict(victims=victims):
                    self._commit_swap(want, victims, decision.freed_mb, now)
                    return
                case Wait():
                    return
                case Impossible(reason=reason):
                    del self.table.wants[model]
                    self.effects.log_decision(f"refuse {model}: {reason}")
                    self.notify(model, record, refused=f"does not fit: {reason}")
                    retry_after = self.config.failed_retry_after_s  # docs/api.md: with Retry-After
                    error = ModelDoesNotFit(model=model, reason=reason, retry_after=retry_after)
                    self.requests.reject_waiters(model, error)

    def keep_alive(self, now: float) -> None:
        """Unload ready models idle (nothing in flight or waiting) past their keep-alive."""
        for model, record in self.table.records.items():
            keep = record.policy.keep_alive_s
            if (
                record.state is ModelState.READY
                and keep is not None
                and not record.policy.pinned
                and record.evict_for is None
                and not self.requests.in_flight(model)
                and not self.requests.waiting(model)
                and now - record.last_used >= keep
            ):
                self.effects.log_decision(f"unload {model}: idle {now - record.last_used:.0f}s")
                record.drain(model, now, self.config.drain_timeout_s)
                self.notify(model, record)

    def _resident_view(self, model: str, record: ModelRecord) -> Resident:
        """The eviction policy's view of a model holding memory."""
        policy, requests = record.policy, self.requests
        return Resident(
            model,
            record.state,
            record.mem_mb,
            policy.pinned,
            policy.priority,
            record.last_used,
            requests.in_flight(model),
            requests.waiting(model),
        )

    def _resident(self, model: str) -> bool:
        record = self.table.records.get(model)
        return record is not None and record.state.holds_memory

    def _ordered_wants(self) -> list[Want]:
        def rank(want: Want) -> tuple[bool, int, float]:
            band = self.requests.top_band(want.model)
            return (not want.victims, -(Band.NORMAL if band is None else band), want.since)

        return sorted(self.table.wants.values(), key=rank)

    def _start_load(self, want: Want, record: ModelRecord, now: float, why: str) -> None:
        model, policy = want.model, want.policy
        del self.table.wants[model]
        waking = record.state is ModelState.SLEEPING
        record.move(model, ModelState.LOADING, now)
        record.policy, record.concurrency = policy, policy.concurrency
        if not waking:
            record.mem_mb = policy.mem_mb
        record.reason, record.exit_code, record.unloading, record.sleep = None, None, False, False
        self.effects.log_decision(f"{'wake' if waking else 'load'} {model} {why}")
        self.notify(model, record)
        self.effects.start_load(model, policy)

    def _commit_swap(self, want: Want, victims: tuple[str, ...], freed: int, now: float) -> None:
        """Victims serve what waits for them for as long as their last load took (at most
        `swap_max_wait_s`), then drain."""
        want.victims = victims
        busy = []
        cap = self.config.swap_max_wait_s
        for victim in victims:
            record = self.table.records[victim]
            window = cap if record.load_s is None else min(cap, record.load_s)
            record.evict_for, record.close_at = want.model, now + window
            if self.requests.in_flight(victim) or self.requests.waiting(victim):
                busy.append(victim)
        self.effects.log_decision(
            f"evict {', '.join(victims)} ({freed} MB) to load {want.model} "
            f"({want.policy.mem_mb} MB); draining first: {', '.join(busy) or 'none'}"
        )
