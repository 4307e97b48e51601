"""The model pool: which models have an engine, in what state, holding how much memory.

The pool does the I/O of the model lifecycle: it starts engines (through the
backends in `launch.py` and the supervisor), keeps the maps of ready engines current
(`engines`, which the data path routes to; `speech`, which the audio path routes to),
measures memory, reacts to engine crashes (restart with backoff when the model asks
for it) and stops engines on unload and at exit. Its states and what they answer are
drawn in `states.py`. The lifecycle is the same for every backend; only the map a
ready engine is filed in differs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from adapters.base import Engine
from adapters.errors import EngineStartFailed
from adapters.supervisor import EngineProcess
from adapters.vllm import VllmEngine, VllmMetricsCollector
from adapters.whisper.engine import WhisperEngine
from faults import QuorumError
from runner.errors import ModelNotFound
from runner.memory.leases import LeaseStore, MemoryLeaseStore
from runner.memory.telemetry import Telemetry
from runner.models_config import ModelsFile, ModelSpec
from runner.pool import routing
from runner.pool.backends import Launcher
from runner.pool.errors import ModelUnavailable
from runner.pool.gpus import GpuAccounting
from runner.pool.launch import Launched, LoadParams
from runner.pool.link import SchedulerLink, _NoScheduler
from runner.pool.sizing import estimate_for, model_size_mb, policy_for
from runner.pool.slot import LoadResult, ModelSlot, UnloadMode, UnloadResult
from runner.pool.states import ModelState
from runner.pool.waiters import Waiters
from runner.scheduler.config import ModelPolicy
from runner.scheduler.errors import ModelDoesNotFit
from runner.settings import Settings
from runner.tasks.eta import EtaEstimator, LoadSpeed

log = logging.getLogger("quorum.pool")

RESTART_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
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
        on_change: Callable[[str, ModelState], None] | None = None,
        leases: LeaseStore | None = None,
        vllm_metrics: VllmMetricsCollector | None = None,
        on_restart: Callable[[ModelSpec], None] | None = None,
    ) -> None:
        self.settings = settings
        self.telemetry = telemetry
        self.launcher = Launcher(
            settings, telemetry, multi_tenant=multi_tenant, vllm_metrics=vllm_metrics
        )
        self.multi_tenant = multi_tenant
        self.clock = clock
        self.on_change = on_change or (lambda _model, _state: None)
        self.on_restart = on_restart or (lambda _spec: None)  # a new engine after a crash
        self.engines: dict[str, Engine] = {}  # ready HTTP engines: the data path's routes
        self.speech: dict[str, WhisperEngine] = {}  # ready speech workers: the audio path's
        self.slots: dict[str, ModelSlot] = {m.id: ModelSlot(m) for m in models.models}
        self._restarts: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._load_waiters: Waiters[LoadResult] = Waiters()
        self._unload_waiters: Waiters[UnloadResult] = Waiters()
        self.scheduler: SchedulerLink = _NoScheduler()
        self._last_process: dict[str, EngineProcess] = {}  # for logs after a crash
        self._closing = False
        # Load time by backend and size (the tasks' eta); until a first load is measured,
        # a guess: llama-server maps its GGUF and starts in about a second.
        self.estimator = EtaEstimator(defaults={"llama-server": LoadSpeed(1.0, 500.0)})
        self.gpus = GpuAccounting(telemetry, leases or MemoryLeaseStore(time.monotonic), settings)
        self.leases = self.gpus.leases
        self.on_loaded: Callable[[str, float], None] = lambda _backend, _seconds: None

    # -- reading ---------------------------------------------------------------------

    def spec(self, model: str) -> ModelSpec | None:
        slot = self.slots.get(model)
        return slot.spec if slot else None

    def state(self, model: str) -> ModelState | None:
        slot = self.slots.get(model)
        return slot.state if slot else None

    def register(self, spec: ModelSpec, *, replace: bool = False) -> None:
        """Add a model a governed load named (from MODEL_BASE_PATH or the HF cache)."""
        slot = self.slots.get(spec.id)
        if slot is None:
            self.slots[spec.id] = ModelSlot(spec)
        elif replace and slot.state in (ModelState.UNLOADED, ModelState.FAILED):
            slot.spec = spec

    def check_unloadable(self, model: str, mode: UnloadMode = "stop") -> None:
        """404 unless `model` has an engine to stop; 400 when it cannot sleep."""
        routing.check_unloadable(self.slots, model, mode, self.settings.vllm_enable_sleep_mode)

    # -- the scheduler's ModelEffects (runner/scheduler/effects.py) ----------------------

    def attach(self, scheduler: SchedulerLink) -> None:
        """Report loads, stops and crashes to `scheduler`; it asks through the methods below."""
        self.scheduler = scheduler

    def policy(self, spec: ModelSpec, budget_mb: int | None = None) -> ModelPolicy:
        """How the scheduler treats `spec` (`sizing.policy_for`)."""
        wants_share = spec.backend == "vllm" and not spec.attached and budget_mb is None
        gpu_total = self.launcher.gpu_total_mb(spec) if wants_share else None
        return policy_for(spec, budget_mb, gpu_total, self.settings.vllm_gpu_memory_utilization)

    def start_load(self, model: str, policy: ModelPolicy) -> None:
        """The scheduler made room: start the engine; answer with ready or failed."""
        self._spawn(self._load_and_report(model), name=f"load-{model}")

    def stop_models(self, models: Sequence[str]) -> None:
        """The scheduler drained these: stop their engines; answer with stopped."""
        for model in models:
            self._spawn(self._stop_and_report(model))

    def load_refused(self, model: str, reason: str) -> None:
        self._settle_loads(model, ModelDoesNotFit(model=model, reason=reason))

    def free_memory_mb(self) -> int:
        return self.gpus.free_memory_mb()

    def log_decision(self, text: str) -> None:
        log.info("%s", text)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str | None = None) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _load_and_report(self, model: str) -> None:
        slot = self.slots[model]
        try:
            result = await self.load(model, slot.params)
        except QuorumError as exc:
            self.scheduler.load_failed(model, str(exc))
            self._settle_loads(model, exc)
            return
        except asyncio.CancelledError:
            self.scheduler.load_failed(model, "load cancelled")
            self._settle_loads(model, ModelUnavailable(f"load of {model!r} was cancelled"))
            raise
        self.scheduler.model_ready(model, slot.spec.slots, result.gpu_memory_mb)
        self._settle_loads(model, result)

    async def _stop_and_report(self, model: str) -> None:
        try:
            result = await self._stop(model)
        except QuorumError as exc:
            self._settle_unloads(model, exc)
        else:
            self._settle_unloads(model, result)
        finally:
            self.scheduler.model_stopped(model)

    def _settle_loads(self, model: str, outcome: LoadResult | Exception) -> None:
        self._load_waiters.settle(model, outcome)

    def _settle_unloads(self, model: str, outcome: UnloadResult | Exception) -> None:
        self._unload_waiters.settle(model, outcome)

    # -- asking through the scheduler --------------------------------------------------

    def want(
        self, model: str, params: LoadParams, evict_first: str | None = None
    ) -> asyncio.Future[LoadResult]:
        """Ask the scheduler for `model` (it makes room by its policy, draining victims
        first); the future resolves when the engine is ready, or with why not."""
        slot = self.slots[model]
        if slot.state is ModelState.READY:
            ready: asyncio.Future[LoadResult] = asyncio.get_running_loop().create_future()
            ready.set_result(LoadResult(model, slot.mem_mb, 0))
            return ready
        future = self._load_waiters.add(model)
        slot.params = params
        policy = self.policy(slot.spec, params.gpu_memory_budget_mb)
        self.scheduler.request_load(model, policy, evict_first)
        return future

    def cancel_load(self, model: str) -> None:
        """Stop a load that is no longer wanted: the engine start is cancelled (its process
        stopped), or the scheduler forgets the want while it still waits for room."""
        slot = self.slots.get(model)
        if slot is None:
            return
        if slot.state is ModelState.LOADING:
            for task in list(self._tasks):
                if task.get_name() == f"load-{model}":
                    task.cancel()
        else:
            self.scheduler.load_failed(model, "load cancelled")
            self._settle_loads(model, ModelUnavailable(f"load of {model!r} was cancelled"))

    async def unload(self, model: str, mode: UnloadMode = "stop") -> UnloadResult:
        """Stop admitting `model`, let the scheduler drain it (bounded), stop it (or put
        it to sleep), measure."""
        self.check_unloadable(model, mode)
        slot = self.slots[model]
        future = self._unload_waiters.add(model)
        slot.unload_mode = mode
        if slot.state is ModelState.SLEEPING:  # the scheduler let it go when it fell asleep
            self._spawn(self._stop_and_report(model))
            return await future
        if slot.state is ModelState.READY:
            slot.move(ModelState.DRAINING)
            self._withdraw(model)
            self.on_change(model, slot.state)
        status = self.scheduler.request_unload(model)
        if status in ("absent", "ready"):  # not managed by the scheduler: stop it now
            self._spawn(self._stop_and_report(model))
        return await future

    def route_missing(self, model: str) -> None:
        """For the data path: a model with no ready engine (`routing.route_missing`)."""
        routing.route_missing(self.slots, model)

    def route_missing_for(self, speech: bool) -> Callable[[str], None]:
        """`route_missing` for one request path: the audio path (`speech`) or the data path;
        a model the other path serves is 400 (`routing.check_endpoint`)."""

        def route(model: str) -> None:
            routing.check_endpoint(self.slots, model, speech)
            routing.route_missing(self.slots, model)

        return route

    def logs(self, model: str, lines: int | None = None) -> list[str]:
        slot = self.slots.get(model)
        if slot is None:
            raise ModelNotFound(f"model {model!r} does not exist on this runner")
        process = slot.process or self._last_process.get(model)
        return process.logs(lines) if process else []

    # -- start-up and exit -----------------------------------------------------------

    async def start(self) -> None:
        """Attach URL engines and load `preload` models (a failure is recorded, not fatal)."""
        for slot in list(self.slots.values()):
            if slot.spec.attached:
                slot.move(ModelState.LOADING)
                try:
                    slot.launched = await self.launcher.launch(slot.spec, LoadParams(), {})
                except QuorumError as exc:
                    log.error("model %s: attaching %s failed: %s", slot.spec.id, slot.spec.url, exc)
                    self._failed(slot, str(exc), None)
                    continue
                self._ready(slot, slot.launched.memory_mb or 0)
                self.scheduler.model_ready(slot.spec.id, slot.launched.slots, slot.mem_mb)
        preload = [s.spec.id for s in self.slots.values() if s.spec.preload]
        for model in preload:  # one after another, through the scheduler's memory policy
            try:
                await self.want(model, LoadParams())
            except QuorumError as exc:
                log.error("preload of %s failed: %s", model, exc)

    async def close(self) -> None:
        """Stop every engine (SIGTERM, grace, SIGKILL)."""
        self._closing = True
        for task in [*self._restarts.values(), *self._tasks]:
            task.cancel()
        for slot in self.slots.values():
            if slot.launched is not None:
                self._withdraw(slot.spec.id)
                await slot.launched.close(grace_s=5.0)
                slot.launched = None
        await self.launcher.close()

    def kill_all(self) -> None:
        """SIGKILL every engine now (last resort on the way out)."""
        for slot in self.slots.values():
            if slot.launched is not None and slot.launched.watch is not None:
                slot.launched.watch.kill_now()

    def engine_pids(self) -> list[int]:
        """Every engine process alive for this runner (sleeping ones and shared servers too)."""
        pids = {
            slot.launched.watch.pid
            for slot in self.slots.values()
            if slot.launched is not None and slot.launched.watch is not None
        }
        pids.update(self.launcher.pids())
        return sorted(pid for pid in pids if pid is not None)

    # -- load ------------------------------------------------------------------------

    async def load(self, model: str, params: LoadParams) -> LoadResult:
        """Start `model`'s engine and wait until it serves.

        1. Unknown model: 404. Already ready: its figures at once. Loading: refused here
           (joining a load in progress is the load task's job).
        2. LOADING; spawn the engine with `CUDA_VISIBLE_DEVICES` for its GPUs.
        3. Healthy: measure its memory (the estimate is replaced by the measurement), READY.
        4. It failed to start: FAILED with the reason (exit code, last log lines); raised.
        """
        slot = self.slots.get(model)  # 1
        if slot is None:
            raise ModelNotFound(f"model {model!r} does not exist on this runner")
        if slot.state is ModelState.READY:
            return LoadResult(model, slot.mem_mb, 0)
        if slot.state is ModelState.SLEEPING:
            if params in (LoadParams(), slot.params):
                return await self._wake(slot)
            await self._stop(model)  # asked for other parameters: a cold start
        if slot.state is not ModelState.UNLOADED and slot.state is not ModelState.FAILED:
            raise ModelUnavailable(f"model {model!r} is {slot.state.value}")
        if slot.launched is not None:  # what a failed engine left behind
            await slot.launched.close(grace_s=1.0)
            slot.launched = None
        slot.move(ModelState.LOADING)  # 2
        self.on_change(model, slot.state)
        slot.params = params
        started = time.monotonic()
        try:
            slot.launched = await self._launch(slot.spec, params)
        except EngineStartFailed as exc:  # 4
            self._failed(slot, str(exc), exc.exit_code)
            raise
        except asyncio.CancelledError:
            self._failed(slot, "load cancelled", None)
            raise
        except QuorumError as exc:
            self._failed(slot, str(exc), None)
            raise
        seconds = time.monotonic() - started
        load_ms = round(1000 * seconds)
        size_mb = model_size_mb(slot.spec)
        if size_mb > 0:
            self.estimator.record(slot.spec.backend, size_mb, seconds)
        self.on_loaded(slot.spec.backend, seconds)
        measured = slot.launched.memory_mb  # 3
        mem = measured if measured is not None else await self._measure(slot)
        self._ready(slot, mem)
        log.info("model %s ready in %d ms, %d MB", model, load_ms, mem)
        return LoadResult(model, mem, load_ms)

    async def _launch(self, spec: ModelSpec, params: LoadParams) -> Launched:
        if spec.backend == "faster-whisper" and self.settings.whisper_device == "cpu":
            return await self.launcher.launch(spec, params, {})  # a CPU worker: no GPU placed
        env, split = await self.gpus.env_for(spec, estimate_for(spec, params.gpu_memory_budget_mb))
        return await self.launcher.launch(spec, params, env, tensor_split=split)

    async def hold_leases(self) -> None:
        """Renew the leases of every model holding memory (the snapshot refresh calls it)."""
        held = (ModelState.READY, ModelState.SLEEPING)  # a sleeping vLLM still holds some
        await self.gpus.hold(
            {m: s.mem_mb for m, s in self.slots.items() if s.state in held and not s.spec.attached}
        )

    async def _measure(self, slot: ModelSlot) -> int:
        process = slot.process
        if process is None or process.pid is None:
            return slot.spec.vram_mb or 0
        pid = process.pid
        return await asyncio.to_thread(self.telemetry.process_used_mb, [pid])

    def _ready(self, slot: ModelSlot, mem_mb: int) -> None:
        assert slot.launched is not None
        slot.move(ModelState.READY)
        slot.mem_mb = mem_mb
        slot.loaded_at = int(self.clock())
        slot.error = None
        slot.exit_code = None
        process = slot.launched.watch
        if process is not None:
            self._last_process[slot.spec.id] = process
            if not slot.launched.watched:
                process.on_exit(functools.partial(self._exited, slot, slot.launched))
                slot.launched.watched = True
        engine = slot.launched.engine
        if isinstance(engine, WhisperEngine):
            self.speech[slot.spec.id] = engine
        else:
            self.engines[slot.spec.id] = engine
        self.on_change(slot.spec.id, slot.state)

    def _failed(self, slot: ModelSlot, reason: str, exit_code: int | None) -> None:
        slot.move(ModelState.FAILED)
        slot.error = reason
        slot.exit_code = exit_code
        self._withdraw(slot.spec.id)
        self.on_change(slot.spec.id, slot.state)

    def _withdraw(self, model: str) -> None:
        """No request path routes to `model` any more."""
        self.engines.pop(model, None)
        self.speech.pop(model, None)

    def _exited(self, slot: ModelSlot, launched: Launched, process: EngineProcess) -> None:
        """The engine process ended; a crash unless the pool asked for it."""
        if process.exit is None or process.exit.expected or slot.launched is not launched:
            return
        how = process.exit.describe()
        launched.lost(f"exited ({how})")
        asleep = slot.state is ModelState.SLEEPING  # the scheduler let it go already
        self._failed(
            slot, process.failure_reason(f"engine exited ({how})"), process.exit.returncode
        )
        log.error("model %s: engine died (%s)", slot.spec.id, how)
        if not asleep:
            self.scheduler.model_crashed(slot.spec.id, f"engine exited ({how})")
        if slot.spec.restart and not self._closing:
            delay = RESTART_BACKOFF_S[min(slot.restarts, len(RESTART_BACKOFF_S) - 1)]
            slot.restarts += 1
            self._restarts[slot.spec.id] = asyncio.get_running_loop().create_task(
                self._restart(slot, delay)
            )

    async def _restart(self, slot: ModelSlot, delay: float) -> None:
        await asyncio.sleep(delay)
        if slot.state is not ModelState.FAILED:  # unloaded or loaded again meanwhile
            return
        if slot.launched is not None:
            await slot.launched.close(grace_s=1.0)
            slot.launched = None
        log.info("model %s: restarting (attempt %d)", slot.spec.id, slot.restarts)
        self.on_restart(slot.spec)
        await self._load_and_report(slot.spec.id)

    # -- unload ----------------------------------------------------------------------

    async def _stop(self, model: str) -> UnloadResult:
        """Measure what the engine holds, stop it (SIGTERM, grace, SIGKILL): that is freed.

        A model asked to sleep sleeps instead (`_sleep`); a model on a shared server
        (ComfyUI) is released from it, and what the server then reports freed is the answer.
        """
        slot = self.slots[model]
        launched = slot.launched
        if launched is None:
            return UnloadResult(model, 0, False)
        mode, slot.unload_mode = slot.unload_mode, "stop"
        if mode == "sleep" and isinstance(launched.engine, VllmEngine):
            return await self._sleep(slot, launched.engine)
        freed = await self._measure(slot) if slot.process is not None else slot.mem_mb
        stoppable = (ModelState.READY, ModelState.DRAINING, ModelState.FAILED, ModelState.SLEEPING)
        if slot.state in stoppable:
            slot.move(ModelState.STOPPING)
        self._withdraw(model)
        if launched.release is not None and launched.engine.failure is None:
            try:
                freed = await launched.release()
            except QuorumError as exc:
                log.warning("model %s: releasing it from its server failed: %s", model, exc)
        await launched.close(grace_s=self.settings.engine_stop_grace_s)
        slot.launched = None
        slot.move(ModelState.UNLOADED)
        slot.mem_mb = 0
        slot.loaded_at = None
        self.on_change(model, slot.state)
        await self.gpus.release(model)
        log.info("model %s stopped, %d MB freed", model, freed)
        return UnloadResult(model, freed, True)

    # -- warm standby (vLLM) -----------------------------------------------------------

    async def _sleep(self, slot: ModelSlot, engine: VllmEngine) -> UnloadResult:
        """`/sleep` (level 1: weights to host memory, KV cache dropped): SLEEPING, the
        process kept; freed = the process's memory before minus after. A sleep that fails
        leaves the model FAILED with the reason (a later stop or load cleans it up)."""
        model = slot.spec.id
        before = await self._measure(slot)
        self.engines.pop(model, None)
        try:
            report = await engine.sleep(level=1)
        except QuorumError as exc:
            self._failed(slot, f"sleep failed: {exc}", None)
            raise
        after = report.memory_mb if report.memory_mb is not None else await self._measure(slot)
        slot.move(ModelState.SLEEPING)
        slot.mem_mb = after
        slot.loaded_at = None
        self.on_change(model, slot.state)
        log.info("model %s asleep: %d MB -> %d MB", model, before, after)
        return UnloadResult(model, max(0, before - after), True, "sleep")

    async def _wake(self, slot: ModelSlot) -> LoadResult:
        """`/wake_up`: READY again with the memory measured right after."""
        launched = slot.launched
        assert launched is not None and isinstance(launched.engine, VllmEngine)
        slot.move(ModelState.LOADING)
        self.on_change(slot.spec.id, slot.state)
        started = time.monotonic()
        try:
            report = await launched.engine.wake_up()
        except QuorumError as exc:
            self._failed(slot, f"wake-up failed: {exc}", None)
            raise
        except asyncio.CancelledError:
            self._failed(slot, "wake-up cancelled", None)
            raise
        mem = report.memory_mb if report.memory_mb is not None else await self._measure(slot)
        self._ready(slot, mem)
        load_ms = round(1000 * (time.monotonic() - started))
        log.info("model %s awake in %d ms, %d MB", slot.spec.id, load_ms, mem)
        return LoadResult(slot.spec.id, mem, load_ms)

    def snapshot(self) -> Mapping[str, ModelSlot]:
        return self.slots
