"""The one watch of the engines: probed, their figures read, off the hot path, on a timer.

Every ENGINE_STATS_INTERVAL_S, one round:

1. **Probes** (`probe_targets`, pure). Every engine whose kind names a probe
   (`Traits.probe_path`: llama-server and vLLM `/health`, ComfyUI `/system_stats`, an
   attached OpenAI engine `/v1/models`; none for a speech worker, whose socket tells) is
   asked it while its model is READY, all at once; models sharing one process (ComfyUI's
   server) are one target. Any HTTP answer within ENGINE_PROBE_TIMEOUT_S, whatever its
   status, means the engine is there (a busy engine still answers it); ENGINE_PROBE_MISSES
   missed in a row (`probes.MissedProbes`) mean it is not. A target whose models left READY
   while it was asked is not counted, and its count is forgotten. Given up, by ownership:
   - an engine the runner started hangs: `EngineProcess.kill(reason)` SIGKILLs its process
     group, and what follows is the crash path every exit takes (the pool's
     `model_crashed`, the restart policy); requests on it get 502 `engine_crashed` naming
     the hang; counted by `on_hang` (`quorum_engine_hangs_total`);
   - an engine attached by URL is lost: `ModelPool.attached_lost` takes it off the request
     paths and tells the scheduler it crashed (no exit code: not our process).
2. **Revival.** A failed attached model (no restart due) whose engine answers again: a
   load is asked for (the scheduler decides, the pool attaches it again); tried again
   after a backoff (the interval, doubling up to `max_backoff_s`) while the load fails.
3. **Figures.** Each ready engine that reports its own load (`Launched.load`: vLLM's
   `/metrics`, ComfyUI's `/queue`, once per server) gives `loads`; each kind's version is
   learnt once (`Traits.version`, else `Launched.version`). `/v1/capabilities` reads both;
   an engine that does not answer in time keeps no figures until it answers again. The
   metric families of engines no longer ready are forgotten.

The watch reads the scheduler's view to advise and reports events; the scheduler decides
what a crash or a load means for the model (docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from adapters.kind import EngineFamilies
from adapters.launched import EngineLoad, Launched
from adapters.supervisor import EngineState
from faults import QuorumError
from runner.engines.kinds import EngineKinds
from runner.engines.probes import HttpProber, MissedProbes, Prober
from runner.engines.record import EngineRecord
from runner.engines.specs import ModelSpecs
from runner.floor.periodic import Periodic
from runner.scheduler.config import ModelPolicy
from runner.scheduler.models import ModelState, ModelView

log = logging.getLogger("quorum.engines")


class Killable(Protocol):
    """What the watch needs of an engine process (`adapters.supervisor.EngineProcess`)."""

    def kill(self, cause: str) -> bool: ...


class WatchedPool(Protocol):
    """What the watch needs of the model pool (`ModelPool`)."""

    @property
    def ready(self) -> Mapping[str, Launched]: ...

    @property
    def records(self) -> Mapping[str, EngineRecord]: ...

    @property
    def specs(self) -> ModelSpecs: ...

    @property
    def kinds(self) -> EngineKinds: ...

    def attached_lost(self, model: str, reason: str) -> None: ...


class WatchedScheduler(Protocol):
    """What the watch needs of the scheduler (`SchedulerAdmission`)."""

    def models(self) -> dict[str, ModelView]: ...

    def request_load(
        self, model: str, policy: ModelPolicy, evict_first: str | None = None
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class Running:
    """One model's engine as the pool holds it (`running_engines`): `process` is the one
    the runner started (None: attached by URL)."""

    model: str
    backend: str
    base_url: str
    probe: str  # the path its kind asks (`Traits.probe_path`)
    key: Hashable  # the process id (engines sharing one process are one), else the model
    process: Killable | None
    ready: bool  # the supervisor's READY: started, not stopping, not exited
    serving: bool  # filed for requests: not loading again, not asleep


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    """One engine to probe, and the READY models it serves."""

    key: Hashable
    backend: str
    probe: str
    url: str
    process: Killable | None
    models: tuple[str, ...]


def probe_targets(running: Iterable[Running], views: Mapping[str, ModelView]) -> list[ProbeTarget]:
    """The engines to probe now (pure).

    1. An engine that is not READY in its supervisor (starting: the load timeout covers
       it; stopping; exited) or whose model is not filed for requests (loading again,
       asleep) is not probed for that model.
    2. Nor for a model the scheduler does not hold READY (loading, draining, unloading,
       sleeping, failed).
    3. One target per engine process, probed while any of its models is READY (ComfyUI's
       one server serves every ComfyUI model).
    """
    by_key: dict[Hashable, ProbeTarget] = {}
    for engine in running:
        if not (engine.ready and engine.serving):  # 1
            continue
        view = views.get(engine.model)
        if view is None or view.state is not ModelState.READY or view.unloading:  # 2
            continue
        known = by_key.get(engine.key)  # 3
        models = (*known.models, engine.model) if known is not None else (engine.model,)
        url = engine.base_url.rstrip("/") + engine.probe
        by_key[engine.key] = ProbeTarget(
            engine.key, engine.backend, engine.probe, url, engine.process, models
        )
    return list(by_key.values())


def hang_reason(probe: str, misses: int, timeout_s: float) -> str:
    """Why the runner killed a hung engine: the model's failure and the requests' 502."""
    return (
        f"hung: stopped answering {probe} ({misses} probes of {timeout_s:g} s missed); "
        "killed by the runner"
    )


def running_engines(pool: WatchedPool) -> list[Running]:
    """The engines of the pool's models that their kinds probe."""
    found = []
    for model, record in pool.records.items():
        launched = record.launched
        probe = pool.kinds.of(record.spec).traits.probe_path
        if launched is None or probe is None:
            continue
        serving = record.loading is None and not record.asleep
        spec = record.spec
        if spec.url is not None:
            found.append(Running(model, spec.backend, spec.url, probe, model, None, True, serving))
            continue
        process = launched.watch
        if process is None or process.pid is None or launched.url is None:
            continue
        ready = process.state is EngineState.READY
        found.append(
            Running(model, spec.backend, launched.url, probe, process.pid, process, ready, serving)
        )
    return found


class EngineWatch:
    """Steps 1-3 of the module docstring, every `interval_s`."""

    def __init__(
        self,
        pool: WatchedPool,
        admission: WatchedScheduler,
        interval_s: float,
        *,
        misses: int = 3,
        timeout_s: float = 5.0,
        max_backoff_s: float = 60.0,
        prober: Prober | None = None,
        families: EngineFamilies | None = None,
        on_hang: Callable[[str, str], None] = lambda _model, _backend: None,
        running: Callable[[], list[Running]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`on_hang(model, backend)` counts a hung engine killed (metrics); `running`
        lists the engines to probe (default: `running_engines(pool)`)."""
        self.pool = pool
        self.admission = admission
        self.interval_s = interval_s
        self.misses = misses
        self.timeout_s = timeout_s
        self.max_backoff_s = max_backoff_s
        self.prober: Prober = prober or HttpProber(timeout_s)
        self.families = families
        self.on_hang = on_hang
        self.running = running or (lambda: running_engines(pool))
        self.clock = clock
        self.loads: dict[str, EngineLoad] = {}
        self.versions: dict[str, str] = {
            k.name: k.traits.version for k in pool.kinds if k.traits.version is not None
        }
        self._missed: MissedProbes[Hashable] = MissedProbes(misses)
        self._answered: dict[Hashable, float] = {}  # when each target last answered (its log)
        self._retry: dict[str, tuple[float, float]] = {}  # model -> (next try, backoff)
        self._timer = Periodic("engine-watch", interval_s, self.poll)

    async def start(self) -> None:
        await self._timer.start()

    async def stop(self) -> None:
        await self._timer.stop()
        await self.prober.aclose()

    async def poll(self) -> None:
        """One round: probes, revivals, figures (module docstring)."""
        await self._probe()
        await self._revive()
        await self._observe()

    def _targets(self) -> list[ProbeTarget]:
        return probe_targets(self.running(), self.admission.models())

    async def _probe(self) -> None:
        """Step 1."""
        targets = self._targets()
        now = self.clock()
        keys = [t.key for t in targets]
        self._missed.keep_only(keys)
        self._answered = {key: self._answered.get(key, now) for key in keys}
        if not targets:
            return
        answers = await asyncio.gather(*(self.prober.answers(t.url) for t in targets))
        still = {t.key for t in self._targets()}
        self._missed.keep_only(still)
        for target, answered in zip(targets, answers, strict=True):
            if target.key not in still:
                continue
            if answered:
                self._answered[target.key] = self.clock()
            if self._missed.observe(target.key, answered):
                self._give_up(target)

    def _give_up(self, target: ProbeTarget) -> None:
        silent_s = self.clock() - self._answered.pop(target.key, self.clock())
        if target.process is None:  # attached by URL: not ours to kill
            reason = f"its engine (attached by URL) stopped answering ({self.misses} probes missed)"
            for model in target.models:
                log.error("model %s: %s", model, reason)
                self.pool.attached_lost(model, reason)
            return
        reason = hang_reason(target.probe, self.misses, self.timeout_s)
        if not target.process.kill(reason):
            return
        log.error(
            "model %s: engine (pid %s) %s; no answer for %.1f s",
            ", ".join(target.models),
            target.key,
            reason,
            silent_s,
        )
        for model in target.models:
            self.on_hang(model, target.backend)

    async def _revive(self) -> None:
        """Step 2."""
        views = self.admission.models()
        for model, spec in self.pool.specs.specs().items():
            view = views.get(model)
            if spec.url is None or view is None:
                continue
            if view.state is ModelState.READY and not view.unloading:
                self._retry.pop(model, None)
            if view.state is not ModelState.FAILED or view.restart_at is not None:
                continue
            probe = self.pool.kinds.of(spec).traits.probe_path
            now = self.clock()
            next_try, backoff = self._retry.get(model, (now, self.interval_s))
            if probe is None or now < next_try:
                continue
            if not await self.prober.answers(spec.url.rstrip("/") + probe):
                continue
            self._retry[model] = (now + backoff, min(backoff * 2, self.max_backoff_s))
            log.info("model %s: its attached engine answers again; attaching it", model)
            self.admission.request_load(model, self.pool.specs.policy(spec))

    async def _observe(self) -> None:
        """Step 3."""
        current = dict(self.pool.ready)
        for model in [m for m in self.loads if m not in current]:
            del self.loads[model]
        if self.families is not None:
            for model in self.families.engines():
                if model not in current:
                    self.families.forget(model)
        servers: set[int] = set()
        for model, launched in current.items():
            record = self.pool.records.get(model)
            backend = record.spec.backend if record is not None else None
            try:
                async with asyncio.timeout(max(1.0, self.interval_s)):
                    load = await self._figures(launched, backend, servers)
            except (QuorumError, TimeoutError) as exc:
                log.debug("model %s: no figures from its engine: %s", model, exc)
                self.loads.pop(model, None)
                continue
            if load is not None:
                self.loads[model] = load

    async def _figures(
        self, launched: Launched, backend: str | None, servers: set[int]
    ) -> EngineLoad | None:
        """One engine's own figures (None: it reports none), and its kind's version once;
        an engine on a server already read this round reads empty."""
        if backend is not None and backend not in self.versions and launched.version:
            version = await launched.version()
            if version is not None:
                self.versions[backend] = version
        if launched.load is None:
            return None
        shared = launched.server
        if shared is not None and id(shared) in servers:
            return EngineLoad()
        if shared is not None:
            servers.add(id(shared))
        return await launched.load()
