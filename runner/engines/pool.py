"""The model pool: engines started, watched and stopped, as the scheduler decides.

The pool is the scheduler's `ModelEffects` (runner/scheduler/effects.py): it starts an
engine when told (`start_load`: the model's engine kind starts or attaches it), stops it
or puts it to sleep when told (`stop_model`), measures memory, and reports what happened
(`ModelReports`: ready, load failed, stopped, asleep, crashed). It decides nothing about
a model's state and gates nothing on it: the scheduler owns that
(`runner/scheduler/models.py`). It files the engines ready to serve in the one map the
request paths read (`ready.ReadyEngines`) and keeps each model's engine facts
(`record.EngineRecord`); which models exist and how they are started is the catalog's
(`specs.ModelSpecs`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from adapters.errors import EngineReplaced, EngineStartFailed
from adapters.launched import Launched
from adapters.supervisor import EngineProcess
from faults import QuorumError
from runner.engines.adapters import AdapterBook
from runner.engines.gpus import EngineHost, GpuAccounting
from runner.engines.launcher import Launcher
from runner.engines.ready import ReadyEngines
from runner.engines.record import EngineRecord
from runner.engines.reports import ModelReports, NoReports
from runner.engines.sizing import model_size_mb
from runner.engines.specs import ModelSpecs
from runner.errors import ModelNotFound
from runner.floor.models_file import ModelSpec
from runner.scheduler.config import ModelPolicy
from runner.tasks.eta import EtaEstimator

log = logging.getLogger("quorum.pool")


class PoolObserver(Protocol):
    """What the pool tells metrics (runner/telemetry/outcome_metrics.py)."""

    def loaded(self, spec: ModelSpec, seconds: float) -> None: ...

    def restarted(self, spec: ModelSpec) -> None: ...

    def crashed(self, spec: ModelSpec) -> None: ...


class NoObserver:
    def loaded(self, spec: ModelSpec, seconds: float) -> None:
        return None

    def restarted(self, spec: ModelSpec) -> None:
        return None

    def crashed(self, spec: ModelSpec) -> None:
        return None


class ModelPool:
    def __init__(
        self,
        specs: ModelSpecs,
        gpus: GpuAccounting,
        host: EngineHost,
        estimator: EtaEstimator,
        *,
        stop_grace_s: float = 10.0,
        drain_timeout_s: float = 30.0,
        observer: PoolObserver | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`estimator` learns each load's time (by backend and size); `drain_timeout_s`
        bounds how long an engine started again waits for its requests before it stops;
        `clock` is the wall clock (`loadedAt`), `monotonic` times loads and wake-ups."""
        self.specs = specs
        self.kinds = specs.kinds
        self.gpus = gpus
        self.host = host
        self.estimator = estimator
        self.stop_grace_s = stop_grace_s
        self.drain_timeout_s = drain_timeout_s
        self.observer = observer or NoObserver()
        self.clock = clock
        self.monotonic = monotonic
        self.ready = ReadyEngines()
        self.records: dict[str, EngineRecord] = {}
        self.adapters = AdapterBook(specs.specs().values(), self.ready.adapters)  # LoRA
        self.launcher = Launcher(self.kinds, gpus, host, self.adapters)
        self.reports: ModelReports = NoReports()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False

    def start(self, reports: ModelReports) -> None:
        """Report to `reports` (the scheduler) from now on; `close` stops every engine."""
        self.reports = reports

    def serving(self) -> list[str]:
        """The models whose engine is up and awake (what the snapshot measures)."""
        return [
            m
            for m, r in self.records.items()
            if r.launched is not None and r.loading is None and not r.asleep
        ]

    def logs(self, model: str, lines: int | None = None) -> list[str]:
        record = self.records.get(model)
        if record is None:
            known = self.specs.specs()
            if model not in known:
                raise ModelNotFound(model=model, models=", ".join(sorted(known)) or "none")
            return []
        process = record.process or record.last_process
        if process is None:  # never started: what its failed start printed
            return record.start_log[-lines:] if lines else list(record.start_log)
        return process.logs(lines)

    # -- the scheduler's ModelEffects (runner/scheduler/effects.py) ----------------------

    def start_load(self, model: str, policy: ModelPolicy) -> None:
        """The scheduler made room: start (or wake) the engine; report ready or failed.

        A model without an engine starts from the catalog's spec and parameters; one whose
        engine failed or sleeps keeps the spec that engine was started from."""
        record = self.records.get(model)
        spec = self.specs.spec(model)
        if record is None:
            assert spec is not None, f"the scheduler loads a model nobody knows: {model}"
            record = self.records[model] = EngineRecord(spec)
        if record.launched is None and spec is not None:
            record.spec, record.params = spec, self.specs.params(model)
        task = self._spawn(self._load_and_report(record), name=f"load-{model}")
        record.loading = task

    def stop_model(self, model: str, sleep: bool, cut: QuorumError | None = None) -> None:
        """The scheduler drained it (or calls its load off): stop the engine, or put it to
        sleep; report stopped or asleep. Requests still on it (its drain timeout passed)
        are answered `cut`, told before their connections drop."""
        record = self.records[model]
        if cut is not None and record.launched is not None:
            record.launched.cut(cut)
        self._spawn(self._stop_and_report(record, sleep), name=f"stop-{model}")

    def free_memory_mb(self) -> int:
        return self.gpus.free_memory_mb()

    def log_decision(self, text: str) -> None:
        log.info("%s", text)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _load_and_report(self, record: EngineRecord) -> None:
        model = record.spec.id
        try:
            mem = await (self._wake(record) if record.asleep else self._load(record))
        except asyncio.CancelledError:
            self.reports.load_failed(model, "the load was cancelled", cancelled=True)
            raise
        except EngineStartFailed as exc:
            record.start_log = exc.log
            self.reports.load_failed(model, _reason(exc), exc.exit_code)
            return
        except QuorumError as exc:
            self.reports.load_failed(model, _reason(exc))
            return
        finally:
            record.loading = None
        self.reports.model_ready(model, record.launched.slots if record.launched else 1, mem)

    async def _stop_and_report(self, record: EngineRecord, sleep: bool) -> None:
        model = record.spec.id
        load = record.loading
        if load is not None:  # a load called off: it reports nothing more
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await load
        try:
            if sleep and record.launched is not None and not record.asleep:
                mem, freed = await self._sleep(record)
                self.reports.model_slept(model, mem, freed)
                return
        except QuorumError as exc:
            log.warning("model %s: sleep failed (%s); stopping it instead", model, exc)
        freed = 0
        try:
            freed = await self._stop(record)
        except QuorumError as exc:
            log.warning("model %s: stopping it failed: %s", model, exc)
        finally:
            self.reports.model_stopped(model, freed)

    # -- start-up and exit -----------------------------------------------------------

    async def close(self) -> None:
        """Stop every engine (SIGTERM, grace, SIGKILL)."""
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        for record in self.records.values():
            if record.launched is not None:
                self.ready.withdraw(record.spec.id)
                await record.launched.close(grace_s=5.0)
                record.launched = None
        await self.kinds.close()

    def engine_pids(self) -> list[int]:
        """Every engine process alive for this runner (sleeping ones and shared servers too)."""
        pids = {
            record.launched.watch.pid
            for record in self.records.values()
            if record.launched is not None and record.launched.watch is not None
        }
        pids.update(self.kinds.pids())
        return sorted(pid for pid in pids if pid is not None)

    async def hold_leases(self) -> None:
        """Renew the leases of every model holding memory (the snapshot refresh calls it)."""
        await self.gpus.hold(
            {
                m: r.mem_mb
                for m, r in self.records.items()
                if r.launched is not None and r.loading is None and not r.spec.attached
            }
        )

    # -- load ------------------------------------------------------------------------

    async def _load(self, record: EngineRecord) -> int:
        """Start the model's engine and wait until it serves; its measured memory.

        1. What a failed engine left behind is closed first (a restart after a crash).
        2. Spawn (or attach) the engine, with `CUDA_VISIBLE_DEVICES` for its GPUs.
        3. Healthy: measure its memory (the estimate is replaced by the measurement);
           file it where its request path finds it.
        """
        spec = record.spec
        if record.launched is not None:  # 1
            await record.launched.close(grace_s=1.0)
            record.launched = None
            self.observer.restarted(spec)
        started = self.monotonic()
        record.launched = await self.launcher.launch(record.spec, record.params)  # 2
        seconds = self.monotonic() - started
        size_mb = model_size_mb(spec)
        if size_mb > 0:
            self.estimator.record(spec.backend, size_mb, seconds)
        self.observer.loaded(spec, seconds)
        mem = await self.launcher.started_mb(record)  # 3
        self._ready(record, mem)
        log.info("model %s ready in %d ms, %d MB", spec.id, round(1000 * seconds), mem)
        return mem

    async def restart_engine(self, model: str) -> None:
        """Start the model's engine again beside the running one, with its adapter set as
        the book has it now; switch the request path to the new one; stop the old one once
        the requests on it are done (bounded by UNLOAD_DRAIN_TIMEOUT_S), saving its slots.
        Nothing waiting or running is refused: a request counts on the old engine from the
        start of its placement (`adapters/in_flight.py`), and one still there past the
        drain timeout fails with `EngineReplaced`, which the chat path retries once on the
        new engine when nothing was sent yet. A start that fails raises, and the old
        engine serves on. (llama-server loads LoRA adapters only at start.)"""
        record = self.records[model]
        old = record.launched
        if old is None or record.loading is not None or record.asleep:
            raise EngineStartFailed(f"model {model!r} has no running engine to restart")
        record.launched = await self.launcher.launch(record.spec, record.params)
        mem = await self.launcher.started_mb(record)
        self._ready(record, mem)
        log.info("model %s: engine started again (%d MB); the old one drains", model, mem)
        if old.adapters is not None and not await old.adapters.drained(self.drain_timeout_s):
            log.warning("model %s: requests still on the old engine after its drain", model)
        old.cut(EngineReplaced(model=model))  # those left are retried on the new engine
        await old.close(grace_s=self.stop_grace_s)

    def _ready(self, record: EngineRecord, mem_mb: int) -> None:
        launched = record.launched
        assert launched is not None
        model = record.spec.id
        record.mem_mb, record.asleep = mem_mb, False
        record.loaded_at = int(self.clock())
        launched.cut(None)  # awake again (a sleep may have cut requests)
        process = launched.watch
        if process is not None:
            record.last_process = process
            if not launched.watched:
                process.on_exit(functools.partial(self._exited, record, launched))
                launched.watched = True
        self.ready.file(model, launched)

    def attached_lost(self, model: str, reason: str) -> None:
        """An engine attached by URL stopped answering (`runner/engines/watch.py`): off the
        request paths, requests still on it fail naming `reason`, and the scheduler hears
        it crashed (no exit code: not our process)."""
        record = self.records.get(model)
        launched = record.launched if record is not None else None
        if record is None or launched is None or not record.spec.attached:
            return
        launched.lost(reason)
        self.ready.withdraw(model)
        self.reports.model_crashed(model, reason, None)

    def _exited(self, record: EngineRecord, launched: Launched, process: EngineProcess) -> None:
        """The engine process ended; a crash unless the pool asked for it."""
        if process.exit is None or process.exit.expected or record.launched is not launched:
            return
        how = process.exit.describe()
        launched.lost(f"exited: {how}")
        self.ready.withdraw(record.spec.id)
        record.exit_code = process.exit.returncode
        log.error(
            "model %s: engine died (%s); last log lines:\n%s",
            record.spec.id,
            how,
            "\n".join(process.logs(20)),
        )
        self.observer.crashed(record.spec)
        if not self._closing:
            self.reports.model_crashed(record.spec.id, f"engine exited: {how}", record.exit_code)

    # -- unload ----------------------------------------------------------------------

    async def _stop(self, record: EngineRecord) -> int:
        """Measure what the engine holds, stop it (SIGTERM, grace, SIGKILL): that is freed.

        A model on a shared server (ComfyUI) is released from it, and what the server then
        reports freed is the answer.
        """
        launched = record.launched
        if launched is None:
            return 0
        model = record.spec.id
        alive = launched.engine.failure is None and launched.watch is not None
        freed = await self.launcher.measure(record) if alive and record.process else record.mem_mb
        self.ready.withdraw(model)
        if launched.release is not None and launched.engine.failure is None:
            try:
                freed = await launched.release()
            except QuorumError as exc:
                log.warning("model %s: releasing it from its server failed: %s", model, exc)
        await launched.close(grace_s=self.stop_grace_s)
        record.launched, record.asleep, record.mem_mb, record.loaded_at = None, False, 0, None
        await self.gpus.release(model)
        log.info("model %s stopped, %d MB freed", model, freed)
        return freed

    # -- warm standby (an engine whose kind can sleep: vLLM) ------------------------------

    async def _sleep(self, record: EngineRecord) -> tuple[int, int]:
        """Sleep (level 1: weights to host memory, KV cache dropped), the process kept;
        its memory after, and freed = the process's memory before minus after."""
        launched = record.launched
        assert launched is not None
        standby = launched.standby
        if standby is None:
            raise EngineStartFailed(f"model {record.spec.id!r} cannot sleep")
        before = await self.launcher.measure(record)
        self.ready.withdraw(record.spec.id)
        report = await standby.sleep(level=1)
        after = (
            report.memory_mb
            if report.memory_mb is not None
            else await self.launcher.measure(record)
        )
        record.asleep, record.mem_mb, record.loaded_at = True, after, None
        log.info("model %s asleep: %d MB -> %d MB", record.spec.id, before, after)
        return after, max(0, before - after)

    async def _wake(self, record: EngineRecord) -> int:
        """Wake up: serving again, with the memory measured right after."""
        launched = record.launched
        assert launched is not None and launched.standby is not None
        started = self.monotonic()
        report = await launched.standby.wake_up()
        mem = (
            report.memory_mb
            if report.memory_mb is not None
            else await self.launcher.measure(record)
        )
        self._ready(record, mem)
        load_ms = round(1000 * (self.monotonic() - started))
        log.info("model %s awake in %d ms, %d MB", record.spec.id, load_ms, mem)
        return mem


def _reason(exc: BaseException) -> str:
    """A failure's first line: what happened, never the engine's log lines after it."""
    return str(exc).split("\n", 1)[0]
