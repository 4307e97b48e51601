"""Engines the runner started, probed while they serve: one that hangs is killed, and that
is a crash (issue 17; docs/reliability.md, section 5).

A hung engine (a deadlock, a stuck driver call, SIGSTOP) keeps its port: the kernel still
accepts connections, nothing answers. No exit tells the supervisor, so the model would
stay loaded while each request on it waited ENGINE_READ_TIMEOUT_S (300 s) for a 504.
Every ENGINE_STATS_INTERVAL_S the watch asks each engine process the runner started the
question of `runner/engines/probes.py` (llama-server and vLLM `/health`, the spawned ComfyUI
`/system_stats`), all of them at once:

1. Which processes (`probe_targets`, pure): those whose model is READY. Not while it
   loads (the load timeout covers that), drains, unloads, sleeps or has failed; not an
   engine attached by URL (`runner/engines/attached_watch.py` probes those); not a speech worker
   (no HTTP: its own channel). Models sharing one process (ComfyUI's server) are one.
2. Each is asked; `MissedProbes` counts the answers missed in a row (ENGINE_PROBE_MISSES,
   3, each ENGINE_PROBE_TIMEOUT_S, 5 s). A process whose models left READY while it was
   asked is not counted, and its count is forgotten: the answer no longer means anything.
3. Given up: `EngineProcess.kill(reason)` SIGKILLs its whole process group. From there it
   is the crash path every exit takes (the supervisor's exit callbacks, the pool's
   `model_crashed` to the scheduler, the restart policy): requests on it get 502
   `engine_crashed` whose message names the hang, queued ones wait for the restart or get
   503 `model_unavailable`, and `quorum_engine_hangs_total` counts it (`on_hang`).

The watch reads the scheduler's view to advise; the scheduler decides what the crash
means for the model (docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from adapters.supervisor import EngineState
from adapters.whisper.engine import WhisperEngine
from runner.engines.probes import HttpProber, MissedProbes, Prober, probe_path, probe_url
from runner.engines.record import EngineRecord
from runner.runtime.periodic import Periodic
from runner.scheduler.models import ModelState, ModelView

log = logging.getLogger("quorum.engines")


class Killable(Protocol):
    """What the watch needs of an engine process (`adapters.supervisor.EngineProcess`)."""

    def kill(self, cause: str) -> bool: ...


class ModelViews(Protocol):
    """What the watch needs of the scheduler (`SchedulerAdmission`)."""

    def models(self) -> dict[str, ModelView]: ...


@dataclass(frozen=True, slots=True)
class Running:
    """One model's engine process as the pool holds it (`running_engines`)."""

    model: str
    backend: str
    base_url: str
    pid: int
    process: Killable
    ready: bool  # the supervisor's READY: started, not stopping, not exited
    serving: bool  # filed for requests: not loading again, not asleep


@dataclass(frozen=True, slots=True)
class Target:
    """One engine process to probe, and the READY models it serves."""

    pid: int
    process: Killable
    backend: str
    url: str
    models: tuple[str, ...]


def probe_targets(running: Iterable[Running], views: Mapping[str, ModelView]) -> list[Target]:
    """The engine processes to probe now (pure).

    1. A process that is not READY in its supervisor (starting: the load timeout covers
       it; stopping; exited) or whose model is not filed for requests (loading again,
       asleep) is not probed for that model.
    2. Nor for a model the scheduler does not hold READY (loading, draining, unloading,
       sleeping, failed).
    3. One target per process, probed while any of its models is READY (ComfyUI's one
       server serves every ComfyUI model).
    """
    by_pid: dict[int, Target] = {}
    for engine in running:
        if not (engine.ready and engine.serving):  # 1
            continue
        view = views.get(engine.model)
        if view is None or view.state is not ModelState.READY or view.unloading:  # 2
            continue
        known = by_pid.get(engine.pid)  # 3
        if known is not None:
            by_pid[engine.pid] = Target(
                known.pid, known.process, known.backend, known.url, (*known.models, engine.model)
            )
            continue
        url = probe_url(engine.base_url, engine.backend)
        by_pid[engine.pid] = Target(
            engine.pid, engine.process, engine.backend, url, (engine.model,)
        )
    return list(by_pid.values())


def hang_reason(backend: str, misses: int, timeout_s: float) -> str:
    """Why the runner killed a hung engine: the model's failure and the requests' 502."""
    return (
        f"hung: stopped answering {probe_path(backend)} ({misses} probes of {timeout_s:g} s "
        "missed); killed by the runner"
    )


def running_engines(records: Mapping[str, EngineRecord]) -> list[Running]:
    """The engine processes the runner started for its models (read from the pool)."""
    found = []
    for model, record in records.items():
        launched = record.launched
        if launched is None or record.spec.attached or isinstance(launched.engine, WhisperEngine):
            continue
        process = launched.watch
        if process is None or process.pid is None:
            continue
        found.append(
            Running(
                model,
                record.spec.backend,
                launched.engine.base_url,
                process.pid,
                process,
                ready=process.state is EngineState.READY,
                serving=record.loading is None and not record.asleep,
            )
        )
    return found


class HangWatch:
    """Steps 1-3 of the module docstring, every `interval_s`."""

    def __init__(
        self,
        records: Mapping[str, EngineRecord],
        scheduler: ModelViews,
        interval_s: float,
        *,
        misses: int = 3,
        timeout_s: float = 5.0,
        prober: Prober | None = None,
        running: Callable[[Mapping[str, EngineRecord]], list[Running]] = running_engines,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.records = records
        self.scheduler = scheduler
        self.misses = misses
        self.timeout_s = timeout_s
        self.prober: Prober = prober or HttpProber(timeout_s)
        self.running = running
        self.clock = clock
        self.on_hang: Callable[[str, str], None] = lambda _model, _backend: None  # metrics
        self._missed: MissedProbes[int] = MissedProbes(misses)  # by pid
        self._answered: dict[int, float] = {}  # pid -> when it last answered (the log line)
        self._timer = Periodic("hang-watch", interval_s, self.poll)

    async def start(self) -> None:
        await self._timer.start()

    async def stop(self) -> None:
        await self._timer.stop()
        await self.prober.aclose()

    def _targets(self) -> list[Target]:
        return probe_targets(self.running(self.records), self.scheduler.models())

    async def poll(self) -> None:
        """Ask every READY engine process once; kill those given up (module docstring)."""
        targets = self._targets()  # 1
        now = self.clock()
        pids = [t.pid for t in targets]
        self._missed.keep_only(pids)
        self._answered = {pid: self._answered.get(pid, now) for pid in pids}
        if not targets:
            return
        answers = await asyncio.gather(*(self.prober.answers(t.url) for t in targets))  # 2
        still = {t.pid for t in self._targets()}
        self._missed.keep_only(still)
        for target, answered in zip(targets, answers, strict=True):
            if target.pid not in still:
                continue
            if answered:
                self._answered[target.pid] = self.clock()
            if self._missed.observe(target.pid, answered):
                self._kill(target)

    def _kill(self, target: Target) -> None:
        """Step 3."""
        reason = hang_reason(target.backend, self.misses, self.timeout_s)
        silent_s = self.clock() - self._answered.pop(target.pid, self.clock())
        if not target.process.kill(reason):
            return
        log.error(
            "model %s: engine (pid %d) %s; no answer for %.1f s",
            ", ".join(target.models),
            target.pid,
            reason,
            silent_s,
        )
        for model in target.models:
            self.on_hang(model, target.backend)
