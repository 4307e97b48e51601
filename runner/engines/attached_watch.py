"""Engines attached by URL, probed: a dead one makes its model unavailable, and the model
comes back by itself once the engine answers again (issue 17, point 4).

The runner owns no process for an engine attached by `url`, so no exit tells it the engine
died: it would stay "loaded" while every request got 502. Every ENGINE_STATS_INTERVAL_S
the watch asks each attached model's engine one cheap question (`runner/engines/probes.py`, shared
with the watch of the engines the runner started, `runner/engines/hang_watch.py`); any HTTP
answer, whatever its status, means the engine is there.

1. A ready model whose engine did not answer `failures` probes in a row
   (ENGINE_PROBE_MISSES, 3; an answer within `timeout_s`, ENGINE_PROBE_TIMEOUT_S, 5 s,
   counts, so a busy engine is not taken for a dead one): the
   pool drops it (`ModelPool.attached_lost`: off the request paths, requests on it end
   502 `engine_crashed`) and tells the scheduler it crashed, with the reason. The model reads
   failed in capabilities (`models.failed`), queued and new requests get 503
   `model_unavailable` with `Retry-After`, and `/health` counts it failed.
2. A failed attached model whose engine answers again: a load is asked for (the scheduler
   decides, the pool attaches it again); tried again after a backoff (the probe interval,
   doubling up to `max_backoff_s`) while the load fails for another reason.

The watch reads the scheduler's view to advise and reports events; the scheduler owns the
model's state (docs/architecture.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

import httpx

from runner.engines.probes import HttpProber, MissedProbes, probe_url
from runner.runtime.models_file import ModelSpec
from runner.runtime.periodic import Periodic
from runner.scheduler.config import ModelPolicy
from runner.scheduler.models import ModelState, ModelView

log = logging.getLogger("quorum.engines")


class AttachedPool(Protocol):
    """What the watch needs of the model pool (`ModelPool`)."""

    def specs(self) -> dict[str, ModelSpec]: ...

    def policy(self, spec: ModelSpec, budget_mb: int | None = None) -> ModelPolicy: ...

    def attached_lost(self, model: str, reason: str) -> None: ...


class AttachedScheduler(Protocol):
    """What the watch needs of the scheduler (`SchedulerAdmission`)."""

    def models(self) -> dict[str, ModelView]: ...

    def request_load(
        self, model: str, policy: ModelPolicy, evict_first: str | None = None
    ) -> None: ...


class AttachedWatch:
    def __init__(
        self,
        pool: AttachedPool,
        scheduler: AttachedScheduler,
        interval_s: float,
        *,
        failures: int = 3,
        timeout_s: float = 5.0,
        max_backoff_s: float = 60.0,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool = pool
        self.scheduler = scheduler
        self.interval_s = interval_s
        self.failures = failures
        self.max_backoff_s = max_backoff_s
        self.clock = clock
        self.prober = HttpProber(timeout_s, transport)
        self._missed: MissedProbes[str] = MissedProbes(failures)  # by model
        self._retry: dict[str, tuple[float, float]] = {}  # model -> (next try, backoff)
        self._timer = Periodic("attached-watch", interval_s, self.poll)

    async def start(self) -> None:
        if any(spec.attached for spec in self.pool.specs().values()):
            await self._timer.start()

    async def stop(self) -> None:
        await self._timer.stop()
        await self.prober.aclose()

    async def poll(self) -> None:
        """Probe every attached model's engine once; act on what changed (module doc)."""
        views = self.scheduler.models()
        watched = [m for m, v in views.items() if v.state is ModelState.READY and not v.unloading]
        self._missed.keep_only(watched)
        for model, spec in self.pool.specs().items():
            view = views.get(model)
            if not spec.attached or spec.url is None or view is None:
                continue
            if view.state is ModelState.READY and not view.unloading:
                await self._watch_ready(model, spec)
            elif view.state is ModelState.FAILED and view.restart_at is None:
                await self._revive(model, spec)

    async def _watch_ready(self, model: str, spec: ModelSpec) -> None:
        """Step 1."""
        self._retry.pop(model, None)
        if not self._missed.observe(model, await self._answers(spec)):
            return
        missed = self.failures
        reason = f"its engine (attached by URL) stopped answering ({missed} probes missed)"
        log.error("model %s: %s", model, reason)
        self.pool.attached_lost(model, reason)

    async def _revive(self, model: str, spec: ModelSpec) -> None:
        """Step 2."""
        now = self.clock()
        next_try, backoff = self._retry.get(model, (now, self.interval_s))
        if now < next_try or not await self._answers(spec):
            return
        self._retry[model] = (now + backoff, min(backoff * 2, self.max_backoff_s))
        log.info("model %s: its attached engine answers again; attaching it", model)
        self.scheduler.request_load(model, self.pool.policy(spec))

    async def _answers(self, spec: ModelSpec) -> bool:
        assert spec.url is not None
        return await self.prober.answers(probe_url(spec.url, spec.backend))
