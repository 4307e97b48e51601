"""The model pool: which models have an engine, in what state, holding how much memory.

The pool does the I/O of the model lifecycle: it starts engines (through the
backends in `launch.py` and the supervisor), keeps `engines` (the ready ones, which
the data path routes to) current, measures memory, reacts to engine crashes
(restart with backoff when the model asks for it) and stops engines on unload and at
exit. Its states and what they answer are drawn in `states.py`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from adapters.base import Engine
from adapters.errors import EngineStartFailed
from adapters.supervisor import EngineProcess
from runner.errors import ModelNotFound, RunnerError, ServiceUnavailable
from runner.memory.telemetry import Telemetry
from runner.models_config import ModelsFile, ModelSpec
from runner.pool.launch import Launched, LoadParams, attach, start_llama_server
from runner.pool.states import ModelState, transition
from runner.settings import Settings

log = logging.getLogger("quorum.pool")

RESTART_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)


class ModelNotLoaded(ModelNotFound):
    code = "model_not_loaded"


class ModelUnavailable(ServiceUnavailable):
    code = "model_unavailable"


@dataclass
class ModelSlot:
    """One model's place in the pool."""

    spec: ModelSpec
    state: ModelState = ModelState.UNLOADED
    launched: Launched | None = None
    loaded_at: int | None = None
    mem_mb: int = 0
    error: str | None = None
    exit_code: int | None = None
    restarts: int = 0
    params: LoadParams = field(default_factory=LoadParams)

    def move(self, to: ModelState) -> None:
        self.state = transition(self.spec.id, self.state, to)

    @property
    def process(self) -> EngineProcess | None:
        return self.launched.process if self.launched else None


@dataclass(frozen=True, slots=True)
class LoadResult:
    model_id: str
    gpu_memory_mb: int
    load_ms: int


@dataclass(frozen=True, slots=True)
class UnloadResult:
    model_id: str
    freed_mb: int
    kv_cache_flushed: bool


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
    ) -> None:
        self.settings = settings
        self.telemetry = telemetry
        self.multi_tenant = multi_tenant
        self.clock = clock
        self.on_change = on_change or (lambda _model, _state: None)
        self.engines: dict[str, Engine] = {}
        self.slots: dict[str, ModelSlot] = {m.id: ModelSlot(m) for m in models.models}
        self._restarts: dict[str, asyncio.Task[None]] = {}
        self._last_process: dict[str, EngineProcess] = {}  # for logs after a crash
        self._closing = False

    # -- reading ---------------------------------------------------------------------

    def spec(self, model: str) -> ModelSpec | None:
        slot = self.slots.get(model)
        return slot.spec if slot else None

    def state(self, model: str) -> ModelState | None:
        slot = self.slots.get(model)
        return slot.state if slot else None

    def route_missing(self, model: str) -> None:
        """For the data path: a model with no ready engine. Raise the right error, or return
        when the request may wait in the queue for it (loading, or autoload)."""
        slot = self.slots.get(model)
        if slot is None:
            known = ", ".join(sorted(self.slots)) or "none"
            raise ModelNotFound(f"model {model!r} does not exist on this runner; models: {known}")
        if slot.state is ModelState.LOADING:
            return
        if slot.state is ModelState.FAILED and not slot.spec.autoload:
            raise ModelUnavailable(f"model {model!r} failed: {slot.error or 'unknown reason'}")
        if slot.state in (ModelState.DRAINING, ModelState.STOPPING):
            raise ModelUnavailable(f"model {model!r} is being unloaded")
        if slot.spec.autoload:
            return
        raise ModelNotLoaded(
            f"model {model!r} is not loaded; load it with POST /v1/models/load (governed)"
        )

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
                slot.launched = await attach(slot.spec, self.settings, self.multi_tenant)
                self._ready(slot, 0)
        preload = [s.spec.id for s in self.slots.values() if s.spec.preload]
        for model in preload:
            try:
                await self.load(model, LoadParams())
            except RunnerError as exc:
                log.error("preload of %s failed: %s", model, exc)

    async def close(self) -> None:
        """Stop every engine (SIGTERM, grace, SIGKILL)."""
        self._closing = True
        for task in self._restarts.values():
            task.cancel()
        for slot in self.slots.values():
            if slot.launched is not None:
                self.engines.pop(slot.spec.id, None)
                await slot.launched.close(grace_s=5.0)
                slot.launched = None

    def kill_all(self) -> None:
        """SIGKILL every engine now (last resort on the way out)."""
        for slot in self.slots.values():
            if slot.process is not None:
                slot.process.kill_now()

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
        if slot.state is not ModelState.UNLOADED and slot.state is not ModelState.FAILED:
            raise ModelUnavailable(f"model {model!r} is {slot.state.value}")
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
        except RunnerError as exc:
            self._failed(slot, str(exc), None)
            raise
        load_ms = round(1000 * (time.monotonic() - started))
        mem = await self._measure(slot)  # 3
        self._ready(slot, mem)
        log.info("model %s ready in %d ms, %d MB", model, load_ms, mem)
        return LoadResult(model, mem, load_ms)

    async def _launch(self, spec: ModelSpec, params: LoadParams) -> Launched:
        env: dict[str, str] = {}
        if spec.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpus)
        elif self.settings.cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.settings.cuda_visible_devices
        if spec.backend == "llama-server":
            return await start_llama_server(spec, params, self.settings, env, self.multi_tenant)
        raise ModelUnavailable(f"backend {spec.backend!r} cannot be started by this runner")

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
        process = slot.process
        if process is not None:
            self._last_process[slot.spec.id] = process
            process.on_exit(functools.partial(self._exited, slot, slot.launched))
        self.engines[slot.spec.id] = slot.launched.engine
        self.on_change(slot.spec.id, slot.state)

    def _failed(self, slot: ModelSlot, reason: str, exit_code: int | None) -> None:
        slot.move(ModelState.FAILED)
        slot.error = reason
        slot.exit_code = exit_code
        self.engines.pop(slot.spec.id, None)
        self.on_change(slot.spec.id, slot.state)

    def _exited(self, slot: ModelSlot, launched: Launched, process: EngineProcess) -> None:
        """The engine process ended; a crash unless the pool asked for it."""
        if process.exit is None or process.exit.expected or slot.launched is not launched:
            return
        how = process.exit.describe()
        launched.engine.failure = f"exited ({how})"
        self._failed(
            slot, process.failure_reason(f"engine exited ({how})"), process.exit.returncode
        )
        launched.engine.http.close()
        log.error("model %s: engine died (%s)", slot.spec.id, how)
        if slot.spec.restart and not self._closing:
            delay = RESTART_BACKOFF_S[min(slot.restarts, len(RESTART_BACKOFF_S) - 1)]
            slot.restarts += 1
            self._restarts[slot.spec.id] = asyncio.get_running_loop().create_task(
                self._restart(slot, delay)
            )

    async def _restart(self, slot: ModelSlot, delay: float) -> None:
        await asyncio.sleep(delay)
        if slot.launched is not None:
            await slot.launched.close(grace_s=1.0)
            slot.launched = None
        log.info("model %s: restarting (attempt %d)", slot.spec.id, slot.restarts)
        try:
            await self.load(slot.spec.id, slot.params)
        except RunnerError as exc:
            log.error("model %s: restart failed: %s", slot.spec.id, exc)

    # -- unload ----------------------------------------------------------------------

    async def unload(
        self, model: str, in_flight: Callable[[], int], drain_timeout_s: float
    ) -> UnloadResult:
        """Stop admitting, drain in-flight requests (bounded), stop the engine, measure.

        1. Not loaded: 404 model_not_loaded.
        2. DRAINING: no new requests reach it; wait until none is in flight, at most
           `drain_timeout_s` (then what is left is cut off when the engine stops).
        3. Measure what the engine holds, STOPPING, stop it: that memory is freed.
        """
        slot = self.slots.get(model)  # 1
        if slot is None:
            raise ModelNotFound(f"model {model!r} does not exist on this runner")
        if slot.state not in (ModelState.READY, ModelState.FAILED) or slot.launched is None:
            raise ModelNotLoaded(f"model {model!r} is not loaded ({slot.state.value})")
        launched = slot.launched
        if slot.state is ModelState.READY:  # 2
            slot.move(ModelState.DRAINING)
            self.engines.pop(model, None)
            self.on_change(model, slot.state)
            deadline = time.monotonic() + drain_timeout_s
            while in_flight() > 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        freed = await self._measure(slot) if slot.process is not None else slot.mem_mb  # 3
        slot.move(ModelState.STOPPING)
        await launched.close(grace_s=self.settings.engine_stop_grace_s)
        slot.launched = None
        slot.move(ModelState.UNLOADED)
        slot.mem_mb = 0
        slot.loaded_at = None
        self.on_change(model, slot.state)
        return UnloadResult(model, freed, True)

    def snapshot(self) -> Mapping[str, ModelSlot]:
        return self.slots
