"""The scheduler's state, and its model half: loading, swapping, draining, keep-alive.

`Scheduler` (core.py) extends `Lifecycle` with the request events. Both halves
are one state machine: the same single task feeds them events, and they act
only through `Effects`.

A managed model lives in a slot: loading → ready → draining → stopping → gone.
Before it has a slot it may be wanted (`Want`): a governed load, or a request
for an `autoload` model, waiting for memory. Memory is planned by the pure
`eviction.plan`; one swap is prepared at a time, and none while a load is in
progress (`plan` step 5):

- the victims are committed (logged once): a victim with requests waiting keeps
  serving them (batching, llama-swap #612) for as long as its last load took,
  never longer than `swap_max_wait_s`, then takes no more and drains; an idle
  one drains at once. Why its load time: evicting it now costs the requests
  waiting for it a reload of that length (and one more load); serving them
  costs the target's waiters the time spent. Waiting as long as the reload
  would take, then evicting, is the ski-rental rule (in that model, never more
  than twice the cost of the better choice made with hindsight). A model never
  loaded by the scheduler batches for `swap_max_wait_s`;
- a drained victim is stopped (`stop_models`); only when every victim is gone
  (`ModelStopped`) is the target planned again, and then it fits: `start_load`.

Requests for the target wait in the queue all along; the cold load counts
against their queue timeout.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter

from runner.scheduler.config import ModelPolicy, SchedulerConfig
from runner.scheduler.effects import Effects
from runner.scheduler.errors import (
    ModelDoesNotFit,
    ModelEngineCrashed,
    ModelLoadFailed,
    ModelUnloading,
    SchedulerError,
)
from runner.scheduler.events import (
    Band,
    LoadFailed,
    LoadRequested,
    ModelCrashed,
    ModelReady,
    ModelStopped,
    Ticket,
    UnloadRequested,
)
from runner.scheduler.eviction import Candidate, Evict, Fits, Impossible, Phase, Wait, plan
from runner.scheduler.residency import Slot, Want
from runner.scheduler.stats import DrainMeter, WaitWindow
from runner.scheduler.waiting import WaitingRoom
from tenants.fairness import VirtualTokenCounter


class Lifecycle(ABC):
    """The scheduler's state and its model events; `Scheduler` adds the request events."""

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
        self._policies: dict[str, ModelPolicy] = dict(config.models)
        self._slots: dict[str, Slot] = {}
        self._wants: dict[str, Want] = {}

    # -- model events ---------------------------------------------------------------

    def on_load_requested(self, event: LoadRequested) -> None:
        """A model is asked for (a governed load, or an autoload request).

        1. Remember its policy (a resident model's slot takes it too).
        2. After shutdown: refused.
        3. Always ready, or loading or ready already: nothing to do (the pool joins).
        4. Otherwise (absent, or on its way out) it is wanted; plan it.
        """
        now, model = event.at, event.model
        self._catch_up(now)
        # 1
        self._policies[model] = event.policy
        slot = self._slots.get(model)
        if slot is not None:
            slot.policy = event.policy
        # 2
        if self._stopped:
            self._effects.load_refused(model, "the runner is shutting down")
            return
        # 3
        if self._always_ready(model) or (
            slot is not None and slot.phase in (Phase.LOADING, Phase.READY)
        ):
            return
        # 4
        self._want(model, event.policy, event.evict_first, now, governed=True)
        self._advance(now)

    def on_model_ready(self, event: ModelReady) -> None:
        """The pool finished a load.

        1. Unknown to the scheduler (a load it did not ask for): adopt it as ready.
        2. Loading: ready, with the measured memory and the engine's concurrency.
           On its way out already (a late answer): only the memory is corrected.
        3. An unload was asked while it loaded: drain it now.
        4. Grant its waiters; move lifecycles on.
        """
        now, model = event.at, event.model
        self._catch_up(now)
        slot = self._slots.get(model)
        adopted = slot is None
        # 1
        if slot is None:
            policy = self._policies.get(model) or ModelPolicy(event.mem_mb, event.concurrency)
            slot = Slot(policy, Phase.LOADING, event.mem_mb, event.concurrency, now, now)
            self._slots[model] = slot
            if model in self._wants:
                self._drop_want(model)
        # 2
        slot.mem_mb = event.mem_mb
        if slot.phase is Phase.LOADING:
            slot.load_s = None if adopted else now - slot.since
            slot.phase, slot.since, slot.last_used = Phase.READY, now, now
            slot.concurrency = event.concurrency
            # 3
            if slot.unloading:
                slot.drain(now, self.config.drain_timeout_s)
        # 4
        self._dispatch(model, now)
        self._advance(now)

    def on_load_failed(self, event: LoadFailed) -> None:
        """A load failed: its reservation is freed and its waiters refused with the reason.

        A failure for a model that is not loading (a stale answer) changes nothing.
        """
        now, model = event.at, event.model
        self._catch_up(now)
        slot = self._slots.get(model)
        if slot is not None and slot.phase is not Phase.LOADING:
            return
        self._slots.pop(model, None)
        if model in self._wants:
            self._drop_want(model)
        self._reject_waiters(model, ModelLoadFailed(model=model, reason=event.reason))
        self._advance(now)

    def on_unload_requested(self, event: UnloadRequested) -> None:
        """Stop admitting requests for a model, drain it, stop it.

        1. Always-ready models are not the pool's: nothing.
        2. Wanted but not started: the want is dropped (its victims reopen).
        3. Its queued requests are refused at once with `ModelUnloading`; later
           ones too while it drains.
        4. Ready: drain now (bounded by the drain timeout). Loading: drain once
           ready. Already draining or stopping: it goes as planned.
        """
        now, model = event.at, event.model
        self._catch_up(now)
        # 1
        if self._always_ready(model):
            return
        # 2
        if model in self._wants:
            self._drop_want(model)
        slot = self._slots.get(model)
        # 3
        queued = len(self._waiting.for_model(model))
        self._reject_waiters(model, ModelUnloading(model=model, reason="it is being unloaded"))
        if slot is None:
            return
        slot.unloading = True
        # 4
        if slot.phase is Phase.READY:
            slot.drain(now, self.config.drain_timeout_s)
        self._effects.log_decision(
            f"unload {model}: {slot.phase} with {self._in_flight[model]} in flight, "
            f"{queued} queued refused"
        )
        self._advance(now)

    def on_model_stopped(self, event: ModelStopped) -> None:
        """The pool stopped a model's engine: it is gone and its memory is free.

        1. Not resident: nothing.
        2. A stop nobody asked for (loading or ready): a crash, never restarted.
        3. Gone. Requests still waiting for it wait for a reload if it is wanted
           or `autoload`; otherwise they are refused with `ModelUnloading`.
        4. Move lifecycles on (a swap waiting for this memory may start).
        """
        now, model = event.at, event.model
        self._catch_up(now)
        # 1
        slot = self._slots.get(model)
        if slot is None:
            return
        # 2
        if slot.phase in (Phase.LOADING, Phase.READY):
            self._crashed(model, slot, "the engine stopped", now, restart=False)
            return
        # 3
        del self._slots[model]
        self._after_gone(model, slot, ModelUnloading(model=model, reason="it was unloaded"), now)
        # 4
        self._advance(now)

    def on_model_crashed(self, event: ModelCrashed) -> None:
        """A model's engine died unasked (see `_crashed`)."""
        self._catch_up(event.at)
        slot = self._slots.get(event.model)
        if slot is not None:
            self._crashed(event.model, slot, event.reason, event.at, slot.policy.restart)

    # -- model decisions ------------------------------------------------------------

    def _crashed(self, model: str, slot: Slot, reason: str, now: float, restart: bool) -> None:
        """An engine died (or stopped unasked).

        1. To be restarted (the policy says so for a crash) and not on its way out:
           it is loading again (the pool restarts it); its waiters keep waiting.
        2. Otherwise it is gone: waiters for a model on its way out follow
           `_after_gone`; the others are refused with `ModelEngineCrashed`.
        """
        # 1
        if restart and not slot.leaving:
            slot.phase, slot.since = Phase.LOADING, now
            self._effects.log_decision(f"restart {model}: {reason}")
            self._advance(now)
            return
        # 2
        del self._slots[model]
        error = ModelEngineCrashed(model=model, reason=reason)
        if slot.leaving:
            self._after_gone(model, slot, error, now)
        else:
            self._reject_waiters(model, error)
        self._advance(now)

    def _after_gone(self, model: str, slot: Slot, error: SchedulerError, now: float) -> None:
        """Its waiters wait for a reload if it is wanted or `autoload` (and not unloaded)."""
        if not self._waiting.model_depth(model):
            return
        if model in self._wants:
            return
        if slot.policy.autoload and not slot.unloading and not self._stopped:
            self._want(model, slot.policy, None, now, governed=False)
            return
        self._reject_waiters(model, error)

    def _advance(self, now: float) -> None:
        """Move the models' lives forward.

        1. Plan the wanted loads (`_plan_wants`).
        2. Victims whose batch is over (the window passed, or nobody waits for
           them) take no more requests: they drain.
        3. Draining models with nothing in flight, or past their drain timeout,
           are stopped (`stop_models`, one call for all).
        """
        if not self._slots and not self._wants:
            return
        # 1
        self._plan_wants(now)
        # 2
        for model, slot in self._slots.items():
            victim = slot.phase is Phase.READY and slot.evict_for is not None
            if victim and (now >= slot.close_at or not self._waiting.model_depth(model)):
                slot.drain(now, self.config.drain_timeout_s)
        # 3
        stop: list[str] = []
        for model, slot in self._slots.items():
            if slot.phase is not Phase.DRAINING:
                continue
            left = self._in_flight[model]
            if left and now < slot.drain_until:
                continue
            if left:
                self._effects.log_decision(f"stop {model}: drain timeout, {left} still in flight")
            slot.phase, slot.since = Phase.STOPPING, now
            stop.append(model)
        if stop:
            self._effects.stop_models(stop)

    def _plan_wants(self, now: float) -> None:
        """Start, or make room for, the wanted loads; one swap is prepared at a time.

        1. Nothing is planned after shutdown. An autoload want nobody waits for
           any more is dropped.
        2. Wants are taken in order: the one whose victims are chosen first, then
           by the best band waiting for it, then the oldest.
        3. A want whose model is still on its way out waits for it to go.
        4. A want whose victims are still resident waits for them: stop here.
        5. Otherwise plan it against the managed models and the memory free now
           (the pool's measure minus the loads in progress):
           - Fits: reserve its memory and `start_load`; go on to the next;
           - Evict: commit the victims (logged once) and stop here;
           - Wait: room is coming (models leaving or loading): stop here;
           - Impossible: refuse it (`load_refused`; its waiters get
             `ModelDoesNotFit`) and go on.
        """
        # 1
        if self._stopped:
            return
        for want in list(self._wants.values()):
            if not want.governed and not self._waiting.model_depth(want.model):
                self._drop_want(want.model)
        # 2
        for want in self._ordered_wants():
            model = want.model
            # 3
            if model in self._slots:
                continue
            # 4
            if any(v in self._slots for v in want.victims):
                return
            # 5
            reserved = sum(s.mem_mb for s in self._slots.values() if s.phase is Phase.LOADING)
            free = self._effects.free_memory_mb() - reserved
            target = Candidate(model, want.policy.mem_mb, want.policy.priority)
            residents = [
                s.resident(m, self._in_flight[m], self._waiting.model_depth(m))
                for m, s in self._slots.items()
            ]
            decision = plan(target, residents, free, want.evict_first)
            match decision:
                case Fits():
                    self._start_load(
                        want, now, f"load {model} ({target.mem_mb} MB): {free} MB free"
                    )
                case Evict(victims=victims):
                    self._commit_swap(want, victims, decision.freed_mb, now)
                    return
                case Wait():
                    return
                case Impossible(reason=reason):
                    del self._wants[model]
                    self._effects.log_decision(f"refuse {model}: {reason}")
                    self._effects.load_refused(model, reason)
                    self._reject_waiters(model, ModelDoesNotFit(model=model, reason=reason))

    def _ordered_wants(self) -> list[Want]:
        def rank(want: Want) -> tuple[bool, int, float]:
            band = self._waiting.top_band(want.model)
            return (not want.victims, -(Band.NORMAL if band is None else band), want.since)

        return sorted(self._wants.values(), key=rank)

    def _start_load(self, want: Want, now: float, why: str) -> None:
        del self._wants[want.model]
        policy = want.policy
        self._slots[want.model] = Slot.loading(policy, now)
        self._effects.log_decision(why)
        self._effects.start_load(want.model, policy)

    def _commit_swap(self, want: Want, victims: tuple[str, ...], freed: int, now: float) -> None:
        """Victims serve what waits for them for as long as their last load took (at most
        `swap_max_wait_s`), then drain."""
        want.victims = victims
        busy = []
        cap = self.config.swap_max_wait_s
        for victim in victims:
            slot = self._slots[victim]
            window = cap if slot.load_s is None else min(cap, slot.load_s)
            slot.evict_for, slot.close_at = want.model, now + window
            if self._in_flight[victim] or self._waiting.model_depth(victim):
                busy.append(victim)
        self._effects.log_decision(
            f"evict {', '.join(victims)} ({freed} MB) to load {want.model} "
            f"({want.policy.mem_mb} MB); draining first: {', '.join(busy) or 'none'}"
        )

    def _keep_alive(self, now: float) -> None:
        """Unload ready models idle (nothing in flight or waiting) past their keep-alive."""
        for model, slot in self._slots.items():
            keep = slot.policy.keep_alive_s
            if (
                slot.phase is Phase.READY
                and keep is not None
                and not slot.policy.pinned
                and slot.evict_for is None
                and not self._in_flight[model]
                and not self._waiting.model_depth(model)
                and now - slot.last_used >= keep
            ):
                self._effects.log_decision(f"unload {model}: idle {now - slot.last_used:.0f}s")
                slot.drain(now, self.config.drain_timeout_s)

    def _want(
        self, model: str, policy: ModelPolicy, evict_first: str | None, now: float, governed: bool
    ) -> None:
        want = self._wants.get(model)
        if want is None:
            self._wants[model] = Want(model, policy, evict_first, now, governed)
            return
        want.policy = policy
        want.governed = want.governed or governed
        want.evict_first = evict_first or want.evict_first

    def _drop_want(self, model: str) -> None:
        """Forget a want; victims still in their batch window go back to normal."""
        want = self._wants.pop(model)
        for victim in want.victims:
            slot = self._slots.get(victim)
            if slot is not None and slot.phase is Phase.READY and slot.evict_for == model:
                slot.evict_for = None

    def _reject_waiters(self, model: str, error: SchedulerError) -> None:
        for ticket in self._waiting.for_model(model):
            self._drop(ticket, error)

    def _always_ready(self, model: str) -> bool:
        if model in self.config.model_concurrency:
            return True
        return self.config.unlisted_ready and model not in self._policies

    # -- provided by the request half (core.py) ---------------------------------------

    @abstractmethod
    def _catch_up(self, now: float) -> None: ...

    @abstractmethod
    def _dispatch(self, model: str, now: float) -> None: ...

    @abstractmethod
    def _drop(self, ticket: Ticket, error: SchedulerError) -> None: ...

    @abstractmethod
    def _touch(self, model: str, now: float) -> None: ...
