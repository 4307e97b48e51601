"""The model pool: engines started, watched and stopped, as the scheduler decides.

The pool is the scheduler's `ModelEffects` (runner/scheduler/effects.py): it starts an
engine when told (`start_load`: through the backends in `backends.py` and the
supervisor), stops it or puts it to sleep when told (`stop_model`), measures memory, and
reports what happened (`ModelReports`: ready, load failed, stopped, asleep, crashed). It
decides nothing about a model's state and gates nothing on it: the scheduler owns that
(`runner/scheduler/models.py`). It keeps the maps of ready engines the request paths
read (`engines` for chat and images, `speech` for audio) and each model's engine facts
(`record.EngineRecord`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from adapters.base import AdapterHost, Engine, FlushScope
from adapters.errors import EngineStartFailed
from adapters.llama_server.engine import LlamaServerEngine, saved_in_scope
from adapters.supervisor import EngineProcess
from adapters.vllm.engine import VllmEngine, VllmMetricsCollector
from adapters.whisper.engine import WhisperEngine
from faults import QuorumError
from runner.engines.adapters import AdapterBook
from runner.engines.backends import Launcher
from runner.engines.gpus import GpuAccounting
from runner.engines.launch import Launched, LoadParams
from runner.engines.record import EngineRecord
from runner.engines.reports import ModelReports, NoReports
from runner.engines.sizing import estimate_for, model_size_mb, policy_for
from runner.errors import ModelNotFound
from runner.memory.leases import LeaseStore, MemoryLeaseStore
from runner.memory.telemetry import Telemetry
from runner.runtime.models_file import ModelsFile, ModelSpec
from runner.runtime.settings import Settings
from runner.scheduler.config import ModelPolicy
from runner.tasks.eta import EtaEstimator, LoadSpeed

log = logging.getLogger("quorum.pool")

LEASE_TTL_S = 30.0  # renewed every snapshot refresh (5 s); a dead runner's leases expire


class ModelPool:
    def __init__(
        self,
        settings: Settings,
        models: ModelsFile,
        telemetry: Telemetry,
        *,
        multi_tenant: bool,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        leases: LeaseStore | None = None,
        vllm_metrics: VllmMetricsCollector | None = None,
    ) -> None:
        self.settings = settings
        self.telemetry = telemetry
        self.launcher = Launcher(
            settings, telemetry, multi_tenant=multi_tenant, vllm_metrics=vllm_metrics
        )
        self.clock = clock  # wall clock: `loadedAt`
        self.monotonic = monotonic  # durations (load, wake) and the default leases' expiry
        self.engines: dict[str, Engine] = {}  # ready HTTP engines: the data path's routes
        self.speech: dict[str, WhisperEngine] = {}  # ready speech workers: the audio path's
        self.records: dict[str, EngineRecord] = {m.id: EngineRecord(m) for m in models.models}
        self.adapters = AdapterBook(models)  # LoRA adapters by model id, on their bases
        self.reports: ModelReports = NoReports()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        # Load time by backend and size (the tasks' eta); until a first load is measured,
        # a guess: llama-server maps its GGUF and starts in about a second; vLLM imports,
        # profiles and warms up for ~30 s before its weights count (measured on the CPU).
        self.estimator = EtaEstimator(
            defaults={"llama-server": LoadSpeed(1.0, 500.0), "vllm": LoadSpeed(30.0, 50.0)}
        )
        self.gpus = GpuAccounting(telemetry, leases or MemoryLeaseStore(monotonic), settings)
        self.leases = self.gpus.leases
        self.on_loaded: Callable[[str, float], None] = lambda _backend, _seconds: None
        self.on_restart: Callable[[ModelSpec], None] = lambda _spec: None
        self.on_crash: Callable[[ModelSpec], None] = lambda _spec: None  # metrics

    # -- the catalog -------------------------------------------------------------------

    def spec(self, model: str) -> ModelSpec | None:
        record = self.records.get(model)
        return record.spec if record else None

    def specs(self) -> dict[str, ModelSpec]:
        return {m: record.spec for m, record in self.records.items()}

    def register(self, spec: ModelSpec, params: LoadParams | None = None) -> None:
        """Know `spec` (a governed load named it), and what its next start asks for.

        A model with an engine keeps its spec until the engine is gone.
        """
        record = self.records.get(spec.id)
        if record is None:
            record = self.records[spec.id] = EngineRecord(spec)
        elif record.launched is None:
            record.spec = spec
        if params is not None:
            record.params = params

    def policy(self, spec: ModelSpec, budget_mb: int | None = None) -> ModelPolicy:
        """How the scheduler treats `spec` (`sizing.policy_for`)."""
        wants_share = spec.backend == "vllm" and not spec.attached and budget_mb is None
        gpu_total = self.launcher.gpu_total_mb(spec) if wants_share else None
        return policy_for(
            spec,
            budget_mb,
            gpu_total,
            self.settings.vllm_gpu_memory_utilization,
            sleep_enabled=self.settings.vllm_enable_sleep_mode,
        )

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
            raise ModelNotFound(model=model, models=", ".join(sorted(self.records)) or "none")
        process = record.process or record.last_process
        if process is None:  # never started: what its failed start printed
            return record.start_log[-lines:] if lines else list(record.start_log)
        return process.logs(lines)

    # -- the scheduler's ModelEffects (runner/scheduler/effects.py) ----------------------

    def attach(self, reports: ModelReports) -> None:
        """Report to `reports` (the scheduler) from now on."""
        self.reports = reports

    def start_load(self, model: str, policy: ModelPolicy) -> None:
        """The scheduler made room: start (or wake) the engine; report ready or failed."""
        record = self.records[model]
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
                self._withdraw(record.spec.id)
                await record.launched.close(grace_s=5.0)
                record.launched = None
        await self.launcher.close()

    def engine_pids(self) -> list[int]:
        """Every engine process alive for this runner (sleeping ones and shared servers too)."""
        pids = {
            record.launched.watch.pid
            for record in self.records.values()
            if record.launched is not None and record.launched.watch is not None
        }
        pids.update(self.launcher.pids())
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
        spec, params = record.spec, record.params
        if record.launched is not None:  # 1
            await record.launched.close(grace_s=1.0)
            record.launched = None
            self.on_restart(spec)
        started = self.monotonic()
        record.launched = await self._launch(spec, params)  # 2
        seconds = self.monotonic() - started
        size_mb = model_size_mb(spec)
        if size_mb > 0:
            self.estimator.record(spec.backend, size_mb, seconds)
        self.on_loaded(spec.backend, seconds)
        measured = record.launched.memory_mb  # 3
        mem = measured if measured is not None else await self._measure(record)
        self._ready(record, mem)
        log.info("model %s ready in %d ms, %d MB", spec.id, round(1000 * seconds), mem)
        return mem

    async def _launch(self, spec: ModelSpec, params: LoadParams) -> Launched:
        cpu_worker = spec.backend == "faster-whisper" and self.settings.whisper_device == "cpu"
        if spec.attached or cpu_worker:  # not our process on a GPU: nothing placed
            return await self.launcher.launch(spec, params, {})
        adapters = await asyncio.to_thread(self.adapters.check_files, spec.id)
        env, split = await self.gpus.env_for(spec, estimate_for(spec, params.gpu_memory_budget_mb))
        return await self.launcher.launch(spec, params, env, tensor_split=split, adapters=adapters)

    def flush_at_rest(self, scope: FlushScope) -> int:
        """Remove the saved prompt states in `scope` of models whose engine is not running
        (the running ones flush their own); expired ones go too. How many were in scope."""
        held = [
            e.store.folder
            for e in self.engines.values()
            if isinstance(e, LlamaServerEngine) and e.store is not None
        ]
        return self.launcher.prefixes.sweep(lambda v: saved_in_scope(v, scope), held)

    async def restart_engine(self, model: str) -> None:
        """Start the model's engine again beside the running one, with its adapter set as
        the book has it now; switch the request path to the new one; stop the old one once
        the requests on it are done (bounded by UNLOAD_DRAIN_TIMEOUT_S), saving its slots.
        Nothing waiting or running is refused. A start that fails raises, and the old
        engine serves on. (llama-server loads LoRA adapters only at start.)"""
        record = self.records[model]
        old = record.launched
        if old is None or record.loading is not None or record.asleep:
            raise EngineStartFailed(f"model {model!r} has no running engine to restart")
        launched = await self._launch(record.spec, record.params)
        record.launched = launched
        mem = launched.memory_mb if launched.memory_mb is not None else await self._measure(record)
        self._ready(record, mem)
        log.info("model %s: engine started again (%d MB); the old one drains", model, mem)
        engine = old.engine
        if isinstance(engine, AdapterHost):
            await engine.drained(self.settings.unload_drain_timeout_s)
        await old.close(grace_s=self.settings.engine_stop_grace_s)

    async def _measure(self, record: EngineRecord) -> int:
        process = record.process
        if process is None or process.pid is None:
            return record.spec.vram_mb or 0
        pid = process.pid
        return await asyncio.to_thread(self.telemetry.process_used_mb, [pid])

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
        engine = launched.engine
        if isinstance(engine, WhisperEngine):
            self.speech[model] = engine
        else:
            self.engines[model] = engine

    def attached_lost(self, model: str, reason: str) -> None:
        """An engine attached by URL stopped answering (`runner/engines/attached_watch.py`): off the
        request paths, requests still on it fail naming `reason`, and the scheduler hears
        it crashed (no exit code: not our process)."""
        record = self.records.get(model)
        launched = record.launched if record is not None else None
        if record is None or launched is None or not record.spec.attached:
            return
        launched.lost(reason)
        self._withdraw(model)
        self.reports.model_crashed(model, reason, None)

    def _withdraw(self, model: str) -> None:
        """No request path routes to `model` any more."""
        self.engines.pop(model, None)
        self.speech.pop(model, None)

    def _exited(self, record: EngineRecord, launched: Launched, process: EngineProcess) -> None:
        """The engine process ended; a crash unless the pool asked for it."""
        if process.exit is None or process.exit.expected or record.launched is not launched:
            return
        how = process.exit.describe()
        launched.lost(f"exited: {how}")
        self._withdraw(record.spec.id)
        record.exit_code = process.exit.returncode
        log.error(
            "model %s: engine died (%s); last log lines:\n%s",
            record.spec.id,
            how,
            "\n".join(process.logs(20)),
        )
        self.on_crash(record.spec)
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
        freed = await self._measure(record) if alive and record.process else record.mem_mb
        self._withdraw(model)
        if launched.release is not None and launched.engine.failure is None:
            try:
                freed = await launched.release()
            except QuorumError as exc:
                log.warning("model %s: releasing it from its server failed: %s", model, exc)
        await launched.close(grace_s=self.settings.engine_stop_grace_s)
        record.launched, record.asleep, record.mem_mb, record.loaded_at = None, False, 0, None
        await self.gpus.release(model)
        log.info("model %s stopped, %d MB freed", model, freed)
        return freed

    # -- warm standby (vLLM) -----------------------------------------------------------

    async def _sleep(self, record: EngineRecord) -> tuple[int, int]:
        """`/sleep` (level 1: weights to host memory, KV cache dropped), the process kept;
        its memory after, and freed = the process's memory before minus after."""
        launched = record.launched
        assert launched is not None
        engine = launched.engine
        if not isinstance(engine, VllmEngine):
            raise EngineStartFailed(f"model {record.spec.id!r} cannot sleep")
        before = await self._measure(record)
        self._withdraw(record.spec.id)
        report = await engine.sleep(level=1)
        after = report.memory_mb if report.memory_mb is not None else await self._measure(record)
        record.asleep, record.mem_mb, record.loaded_at = True, after, None
        log.info("model %s asleep: %d MB -> %d MB", record.spec.id, before, after)
        return after, max(0, before - after)

    async def _wake(self, record: EngineRecord) -> int:
        """`/wake_up`: serving again, with the memory measured right after."""
        launched = record.launched
        assert launched is not None and isinstance(launched.engine, VllmEngine)
        started = self.monotonic()
        report = await launched.engine.wake_up()
        mem = report.memory_mb if report.memory_mb is not None else await self._measure(record)
        self._ready(record, mem)
        load_ms = round(1000 * (self.monotonic() - started))
        log.info("model %s awake in %d ms, %d MB", record.spec.id, load_ms, mem)
        return mem


def _reason(exc: BaseException) -> str:
    """A failure's first line: what happened, never the engine's log lines after it."""
    return str(exc).split("\n", 1)[0]
