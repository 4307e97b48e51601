"""The scheduler's model half: what each model event does to the model's record.

`ModelLifecycle` is fed the model events (asked for by the API: `LoadRequested`,
`UnloadRequested`; reported by the pool: `ModelReady`, `LoadFailure`,
`ModelStopped`, `ModelSlept`, `ModelCrashed`) by `core.Scheduler`, moves the
records of `models.ModelTable` through their states, tells listeners each change
(`ModelNotice`), and leaves planning forward in time to `swaps.Swaps`.
"""

from __future__ import annotations

from runner.scheduler.config import ModelPolicy, SchedulerConfig
from runner.scheduler.effects import Effects
from runner.scheduler.errors import (
    ModelFailed,
    ModelLoadFailed,
    ModelUnloading,
    SchedulerError,
)
from runner.scheduler.events import (
    LoadCancellation,
    LoadFailure,
    LoadRequested,
    ModelCrashed,
    ModelEvent,
    ModelReady,
    ModelSlept,
    ModelStopped,
    UnloadRequested,
)
from runner.scheduler.models import ModelRecord, ModelState, ModelTable
from runner.scheduler.swaps import Requests, Swaps


class ModelLifecycle:
    """Model events, one method each; see the module docstring."""

    def __init__(
        self,
        config: SchedulerConfig,
        table: ModelTable,
        swaps: Swaps,
        requests: Requests,
        effects: Effects,
    ) -> None:
        self.config = config
        self.table = table
        self.swaps = swaps
        self.requests = requests
        self.effects = effects

    def handle(self, event: ModelEvent) -> None:
        """One model event, to its handler below."""
        match event:
            case LoadRequested():
                self.on_load_requested(event)
            case LoadCancellation():
                self.on_load_cancelled(event)
            case ModelReady():
                self.on_model_ready(event)
            case LoadFailure():
                self.on_load_failed(event)
            case UnloadRequested():
                self.on_unload_requested(event)
            case ModelStopped():
                self.on_model_stopped(event)
            case ModelSlept():
                self.on_model_slept(event)
            case ModelCrashed():
                self.on_model_crashed(event)

    def on_load_requested(self, event: LoadRequested) -> None:
        """A model is asked for (a governed load).

        1. Remember its policy (a model it has a record for takes it too).
        2. After shutdown: refused.
        3. Loading or ready already: nothing to do (the load joins); an unload asked while
           it loads is called off.
        4. Otherwise (absent, failed, asleep, or on its way out) it is wanted; plan it.
        """
        now, model = event.at, event.model
        if model in self.table.fixed:  # always ready: nothing to load
            return
        record = self.table.add(model, event.policy)  # 1
        if self.swaps.stopped:  # 2
            self.swaps.notify(model, record, refused="the runner is shutting down")
            return
        if record.state is ModelState.LOADING or (  # 3
            record.state is ModelState.READY and not record.unloading
        ):
            record.unloading = record.sleep = False
            self.swaps.notify(model, record)
            return
        record.unloading = False  # 4
        record.restart_at = None
        self.swaps.want(model, event.policy, event.evict_first, now, governed=True)
        self.swaps.advance(now)

    def on_load_cancelled(self, event: LoadCancellation) -> None:
        """A governed load is called off.

        1. Still wanted: the want is forgotten (listeners are told it is refused).
        2. Loading: its start is stopped (`stop_model`; `ModelStopped` follows).
        3. Its waiters are refused with `ModelLoadFailed` (cancelled).
        """
        now, model = event.at, event.model
        record = self.table.records.get(model)
        if record is None:
            return
        if model in self.table.wants:  # 1
            self.swaps.drop_want(model)
            self.swaps.notify(model, record, refused="the load was cancelled")
        elif record.state is ModelState.LOADING:  # 2
            record.move(model, ModelState.STOPPING, now)
            self.swaps.notify(model, record)
            self.effects.stop_model(model, False)
        else:
            return
        error = ModelLoadFailed(
            model=model, reason="the load was cancelled", retry_after=self._retry_after()
        )
        self.requests.reject_waiters(model, error)  # 3
        self.swaps.advance(now)

    def on_model_ready(self, event: ModelReady) -> None:
        """The pool finished a load.

        1. Unknown to the scheduler (a load it did not ask for): adopt it as ready.
        2. Loading: ready, with the measured memory and the engine's concurrency.
           Otherwise (a late answer) only the memory is corrected.
        3. An unload was asked while it loaded: drain it now.
        4. Grant its waiters; move lifecycles on.
        """
        now, model = event.at, event.model
        record = self.table.records.get(model)
        if record is None:  # 1
            record = self.table.add(model, ModelPolicy(event.mem_mb, event.concurrency))
            record.move(model, ModelState.LOADING, now)
            self.table.wants.pop(model, None)
        elif record.state is ModelState.LOADING:
            record.load_s = now - record.since
        record.mem_mb = event.mem_mb
        if record.state is ModelState.LOADING:  # 2
            record.move(model, ModelState.READY, now)
            record.last_used, record.concurrency = now, event.concurrency
            if record.unloading:  # 3
                record.drain(model, now, self.config.drain_timeout_s)
        self.swaps.notify(model, record)
        self.requests.dispatch(model, now)  # 4
        self.swaps.advance(now)

    def on_load_failed(self, event: LoadFailure) -> None:
        """A load failed: its reservation is freed and its waiters refused with the reason.

        1. A failure for a model that is not loading (a stale answer) changes nothing.
        2. Cancelled: absent again. Otherwise failed, with the reason (and exit code).
        3. Its waiters are refused with `ModelLoadFailed`.
        """
        now, model = event.at, event.model
        record = self.table.records.get(model)
        if record is None or record.state is not ModelState.LOADING:  # 1
            return
        if event.cancelled:  # 2
            record.move(model, ModelState.ABSENT, now)
            record.mem_mb = 0
        else:
            self._fail(model, record, event.reason, event.exit_code, now)
        self.swaps.notify(model, record)
        error = ModelLoadFailed(model=model, reason=event.reason, retry_after=self._retry_after())
        self.requests.reject_waiters(model, error)  # 3
        self.swaps.advance(now)

    def on_unload_requested(self, event: UnloadRequested) -> None:
        """Stop admitting requests for a model, drain it, stop it (or put it to sleep).

        1. Wanted but not started: the want is dropped (its victims reopen).
        2. Its queued requests are refused at once with `ModelUnloading`; later ones
           too while it drains.
        3. By its state: ready, drain now (bounded by the drain timeout); loading,
           drain once ready; draining or stopping, it goes as planned; failed or
           asleep, stop what is left of it now; absent: nothing to stop (listeners
           are told it is absent, freed 0).
        """
        now, model = event.at, event.model
        record = self.table.get(model)
        if record is None or model in self.table.fixed:
            return
        if model in self.table.wants:  # 1
            self.swaps.drop_want(model)
        queued = self.requests.waiting(model)  # 2
        self.requests.reject_waiters(model, ModelUnloading(model=model, reason="it is unloaded"))
        record.unloading, record.sleep, record.restart_at = True, event.sleep, None
        state = record.state  # 3
        if state is ModelState.READY:
            record.drain(model, now, self.config.drain_timeout_s)
        elif state in (ModelState.FAILED, ModelState.SLEEPING):
            record.move(model, ModelState.STOPPING, now)
            self.effects.stop_model(model, False)
        elif state is ModelState.ABSENT:
            self.swaps.notify(model, record, freed_mb=0)
            return
        self.effects.log_decision(
            f"unload {model}: {state} with {self.requests.in_flight(model)} in flight, "
            f"{queued} queued refused"
        )
        self.swaps.notify(model, record)
        self.swaps.advance(now)

    def on_model_stopped(self, event: ModelStopped) -> None:
        """The pool stopped a model's engine: it is gone and its memory is free.

        1. Holding nothing: nothing.
        2. A stop nobody asked for (loading or ready): a crash, never restarted.
        3. Absent. Requests still waiting for it wait for a reload if it is wanted or
           `autoload`; otherwise they are refused with `ModelUnloading`.
        """
        now, model = event.at, event.model
        record = self.table.records.get(model)
        if record is None or not record.state.holds_memory:  # 1
            return
        if record.state in (ModelState.LOADING, ModelState.READY):  # 2
            self._crashed(model, record, "the engine stopped", None, now, restart=False)
            return
        record.move(model, ModelState.ABSENT, now)  # 3
        record.mem_mb, record.evict_for = 0, None
        self.swaps.notify(model, record, freed_mb=event.freed_mb)
        self._after_gone(model, record, now)
        self.swaps.advance(now)

    def on_model_slept(self, event: ModelSlept) -> None:
        """The pool put a drained model to sleep: asleep, holding what it still holds."""
        now, model = event.at, event.model
        record = self.table.records.get(model)
        if record is None or record.state is not ModelState.STOPPING:
            return
        record.move(model, ModelState.SLEEPING, now)
        record.mem_mb, record.unloading, record.sleep = event.mem_mb, False, False
        self.swaps.notify(model, record, freed_mb=event.freed_mb)
        self.swaps.advance(now)

    def on_model_crashed(self, event: ModelCrashed) -> None:
        """A model's engine died unasked (see `_crashed`)."""
        record = self.table.records.get(event.model)
        if record is not None and record.state.holds_memory:
            restart = record.policy.restart
            self._crashed(event.model, record, event.reason, event.exit_code, event.at, restart)

    # -- decisions ------------------------------------------------------------------

    def _crashed(
        self,
        model: str,
        record: ModelRecord,
        reason: str,
        exit_code: int | None,
        now: float,
        restart: bool,
    ) -> None:
        """An engine died (or stopped unasked).

        1. On its way out (unloaded, evicted, draining): it is gone, as if stopped.
        2. It was ready for `restart_window_s`: its crash count starts again.
        3. Failed, with the reason and exit code. To be restarted (its policy says so)
           and not in a crash loop (`max_restarts`): the restart is due after the
           backoff, and its waiters keep waiting (bounded by the queue timeout).
        4. Otherwise its waiters are refused: 503 `model_unavailable` with the reason
           and `Retry-After` (requests in flight got 502 `engine_crashed` already).
        """
        if record.leaving:  # 1
            record.move(model, ModelState.ABSENT, now)
            record.mem_mb, record.evict_for = 0, None
            self.swaps.notify(model, record, freed_mb=0)
            self._after_gone(model, record, now)
            self.swaps.advance(now)
            return
        ready_for = now - record.since if record.state is ModelState.READY else 0.0
        if ready_for >= self.config.restart_window_s:  # 2
            record.crashes = 0
        record.crashes += 1
        self._fail(model, record, reason, exit_code, now)  # 3
        backoff = self.config.restart_backoff_s
        if restart and record.crashes <= self.config.max_restarts:
            record.restart_at = now + backoff[min(record.crashes, len(backoff)) - 1]
            delay = record.restart_at - now
            self.effects.log_decision(f"restart {model} in {delay:.0f}s: {reason}")
        elif restart:
            record.reason = f"{reason}; not restarted after {record.crashes} crashes in a row"
        self.swaps.notify(model, record)
        if record.restart_at is None:  # 4
            self.requests.reject_waiters(model, self._failed_error(model, record))
        self.swaps.advance(now)

    def _fail(
        self, model: str, record: ModelRecord, reason: str, exit_code: int | None, now: float
    ) -> None:
        record.move(model, ModelState.FAILED, now)
        record.mem_mb, record.evict_for, record.unloading = 0, None, False
        record.reason, record.exit_code, record.restart_at = reason, exit_code, None

    def _failed_error(self, model: str, record: ModelRecord) -> SchedulerError:
        return ModelFailed(
            model=model,
            reason=record.reason or "its engine failed",
            retry_after=self._retry_after(),
        )

    def _retry_after(self) -> int:
        return self.config.failed_retry_after_s

    def _after_gone(self, model: str, record: ModelRecord, now: float) -> None:
        """Its waiters wait for a reload if it is wanted or `autoload` (and not unloaded)."""
        if not self.requests.waiting(model) or model in self.table.wants:
            return
        if record.policy.autoload and not record.unloading and not self.swaps.stopped:
            self.swaps.want(model, record.policy, None, now, governed=False)
            return
        error = ModelUnloading(model=model, reason="it was unloaded")
        self.requests.reject_waiters(model, error)
