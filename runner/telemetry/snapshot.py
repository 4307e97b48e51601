"""What the runner holds, read off the hot path: devices, memory per model, KV cache.

`/v1/capabilities`, `/health` and `/metrics` answer from the latest `ResourceSnapshot`,
which `Refresher` rebuilds every `interval_s` (5 s: the router polls every 5 s) in the
background. Nothing that answers a request waits on an engine or on NVML.

Memory per model is measured (NVML per process on a GPU; the engine process tree's
resident memory without one) and split into weights (the model files' size, capped at
the measurement) and the rest: KV cache and the engine's compute buffers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from faults import QuorumError
from runner.engines.pool import ModelPool
from runner.engines.sizing import model_size_mb
from runner.floor.periodic import Periodic
from runner.memory.telemetry import GpuInfo, Telemetry

log = logging.getLogger("quorum.snapshot")


@dataclass(frozen=True, slots=True)
class ModelMemory:
    model: str
    total_mb: int
    weights_mb: int
    kv_mb: int  # KV cache and compute buffers: measured memory beyond the weights
    kv_utilization: float  # share of the engine's context slots holding cached tokens
    other_mb: int = 0  # an engine with no KV cache: its memory beyond the weights
    kv_cache: bool = True  # the engine has a KV cache (its kind's `Traits.kv_cache`: the
    # memory ComfyUI or faster-whisper holds beyond their weights is `other`, not KV cache)


@dataclass(frozen=True, slots=True)
class ResourceSnapshot:
    taken_at: float = 0.0
    source: str = "none"
    gpus: tuple[GpuInfo, ...] = ()
    models: tuple[ModelMemory, ...] = ()
    telemetry_error: str | None = None
    available: tuple[str, ...] = ()  # the catalog: models file, MODEL_BASE_PATH, HF cache

    @property
    def total_mb(self) -> int:
        return sum(g.total_mb for g in self.gpus)

    @property
    def used_mb(self) -> int:
        return sum(g.used_mb for g in self.gpus)

    @property
    def free_mb(self) -> int:
        return sum(g.free_mb for g in self.gpus)

    @property
    def utilization(self) -> float:
        known = [g.utilization for g in self.gpus if g.utilization is not None]
        return round(sum(known) / len(known), 3) if known else 0.0

    @property
    def kv_mb(self) -> int:
        return sum(m.kv_mb for m in self.models)

    @property
    def kv_utilization(self) -> float:
        sized = [m for m in self.models if m.kv_mb > 0]
        if not sized:
            return 0.0
        weighted = sum(m.kv_utilization * m.kv_mb for m in sized)
        return round(weighted / sum(m.kv_mb for m in sized), 3)

    def out_of_memory(self, margin_mb: int = 0) -> bool:
        """Every device is full (and there is a device): the GPU is out of memory."""
        return bool(self.gpus) and all(g.free_mb <= margin_mb for g in self.gpus)


@dataclass
class Refresher:
    """Rebuilds the snapshot every `interval_s`, and soon after a model changes state
    (`soon`: a model just loaded or stopped shows its memory at once, not up to
    `interval_s` later); `current` is what handlers read."""

    pool: ModelPool
    telemetry: Telemetry
    catalog: Callable[[], list[str]] = list
    interval_s: float = 5.0
    clock: Callable[[], float] = time.time
    current: ResourceSnapshot = field(default_factory=ResourceSnapshot)

    def __post_init__(self) -> None:
        self._timer = Periodic("snapshot", self.interval_s, self.refresh)
        self._soon: asyncio.Task[ResourceSnapshot] | None = None

    async def start(self) -> None:
        await self._timer.start()

    async def stop(self) -> None:
        await self._timer.stop()
        if self._soon is not None:
            self._soon.cancel()

    def soon(self) -> None:
        """Refresh once more as soon as the loop is free (one at a time, never stacked)."""
        if self._soon is None or self._soon.done():
            self._soon = asyncio.get_running_loop().create_task(self.refresh())

    async def refresh(self) -> ResourceSnapshot:
        error = None
        try:
            snap = await asyncio.to_thread(self.telemetry.snapshot)
            gpus, source = snap.gpus, snap.source
        except QuorumError as exc:
            gpus, source, error = (), "unavailable", str(exc)
        models = [await self._model(m) for m in self.pool.serving()]
        try:
            await self.pool.hold_leases()
        except QuorumError as exc:  # the store is down: keep serving, say so in the log
            log.warning("memory leases not renewed: %s", exc)
        names = await asyncio.to_thread(self.catalog)
        self.current = ResourceSnapshot(
            self.clock(), source, gpus, tuple(m for m in models if m), error, tuple(names)
        )
        return self.current

    async def _model(self, model: str) -> ModelMemory | None:
        record = self.pool.records[model]
        if record.launched is None or record.spec.attached:
            return None
        total = record.mem_mb
        process = record.process
        if process is not None and process.pid is not None:
            with contextlib.suppress(QuorumError):
                total = await asyncio.to_thread(self.telemetry.process_used_mb, [process.pid])
                record.mem_mb = total
        weights = min(total, round(model_size_mb(record.spec)))
        beyond = max(0, total - weights)
        utilization = 0.0
        kv = record.launched.kv  # an engine that tells how much of its KV cache is in use
        if kv is not None:
            with contextlib.suppress(Exception):
                utilization = await kv(beyond)
        if not self.pool.kinds.of(record.spec).traits.kv_cache:
            return ModelMemory(model, total, weights, 0, 0.0, other_mb=beyond, kv_cache=False)
        return ModelMemory(model, total, weights, beyond, utilization)


class SnapshotCollector(Collector):
    """Prometheus families read from the latest snapshot at scrape time (no engine calls)."""

    def __init__(self, current: Callable[[], ResourceSnapshot]) -> None:
        self.current = current

    def collect(self) -> Iterator[Metric]:
        snap = self.current()
        used = GaugeMetricFamily(
            "quorum_gpu_memory_used_bytes", "GPU memory in use, per device", labels=["gpu"]
        )
        total = GaugeMetricFamily(
            "quorum_gpu_memory_total_bytes", "GPU memory, per device", labels=["gpu"]
        )
        for g in snap.gpus:
            used.add_metric([str(g.index)], g.used_mb * MIB)
            total.add_metric([str(g.index)], g.total_mb * MIB)
        split = GaugeMetricFamily(
            "quorum_model_memory_bytes",
            "Memory each loaded model holds: weights, and KV cache with compute buffers "
            "(engines with a KV cache) or other (engines without one)",
            labels=["model", "kind"],
        )
        for m in snap.models:
            split.add_metric([m.model, "weights"], m.weights_mb * MIB)
            if m.kv_cache:
                split.add_metric([m.model, "kv_cache"], m.kv_mb * MIB)
            else:
                split.add_metric([m.model, "other"], m.other_mb * MIB)
        yield used
        yield total
        yield split


MIB = 1024 * 1024
