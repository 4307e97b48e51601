"""Driving the pool as the scheduler does: `start_load` / `stop_model`, then wait for the
report it sends back (no sleeps: each report resolves a future)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from adapters.engine_families import EngineFamiliesCollector
from runner.engines.gpus import EngineHost, GpuAccounting
from runner.engines.kinds import EngineKinds, engine_settings
from runner.engines.pool import ModelPool, PoolObserver
from runner.engines.specs import ModelSpecs
from runner.floor.models_file import ModelSpec
from runner.floor.settings import Settings
from runner.memory.leases import LeaseStore, MemoryLeaseStore
from runner.memory.telemetry import Telemetry
from runner.tasks.eta import EtaEstimator


def make_pool(
    settings: Settings,
    models: list[ModelSpec],
    telemetry: Telemetry,
    *,
    clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
    leases: LeaseStore | None = None,
    observer: PoolObserver | None = None,
) -> ModelPool:
    """A pool as the runtime builds it (runner/runtime/wiring.py), its parts given."""
    kinds = EngineKinds(engine_settings(settings))
    host = EngineHost(telemetry, EngineFamiliesCollector())
    return ModelPool(
        ModelSpecs(models, kinds, host.gpu_total_mb),
        GpuAccounting(
            telemetry,
            leases or MemoryLeaseStore(monotonic),
            settings.runner_id,
            settings.cuda_visible_devices,
        ),
        host,
        EtaEstimator(),
        stop_grace_s=settings.engine_stop_grace_s,
        observer=observer,
        clock=clock,
        monotonic=monotonic,
    )


@dataclass
class Reports:
    """A `ModelReports` that records every report and wakes whoever waits for one."""

    seen: list[tuple[str, ...]] = field(default_factory=list)
    _waiters: list[asyncio.Future[tuple[str, ...]]] = field(default_factory=list)

    def _add(self, *report: str) -> None:
        self.seen.append(report)
        for future in self._waiters:
            if not future.done():
                future.set_result(report)
        self._waiters.clear()

    async def next(self, timeout_s: float = 30.0) -> tuple[str, ...]:
        future: asyncio.Future[tuple[str, ...]] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        return await asyncio.wait_for(future, timeout_s)

    def model_ready(self, model: str, concurrency: int, mem_mb: int) -> None:
        self._add("ready", model, str(mem_mb))

    def load_failed(
        self, model: str, reason: str, exit_code: int | None = None, cancelled: bool = False
    ) -> None:
        self._add("failed", model, reason)

    def model_stopped(self, model: str, freed_mb: int = 0) -> None:
        self._add("stopped", model, str(freed_mb))

    def model_slept(self, model: str, mem_mb: int, freed_mb: int) -> None:
        self._add("slept", model, str(freed_mb))

    def model_crashed(self, model: str, reason: str, exit_code: int | None = None) -> None:
        self._add("crashed", model, reason)


async def load(pool: ModelPool, model: str) -> tuple[str, ...]:
    """Have the pool start `model` as the scheduler would; its report (ready or failed)."""
    reports = pool.reports if isinstance(pool.reports, Reports) else Reports()
    pool.start(reports)
    spec = pool.specs.spec(model)
    assert spec is not None
    outcome = asyncio.ensure_future(reports.next())
    pool.start_load(model, pool.specs.policy(spec))
    return await outcome
