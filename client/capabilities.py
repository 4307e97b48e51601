"""A typed, read-only view of a runner's `GET /v1/capabilities` document (pure).

The document is the contract's (seed 002) plus the runner's additions (`models.failed`,
`queue.running`, `resources.memorySource`, and `queue.forecastWaitMs` per priority where
the runner reports it). Parsing is lenient about what is missing (a number the runner
does not report reads 0, a list reads empty) and strict about shape: a document that is
not a JSON object, or whose sections are not objects, raises ValueError. The raw document
stays available as `raw` for anything this view does not name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

ModelState = Literal["loaded", "loading", "available", "failed"]
PRIORITIES = ("high", "normal", "low")


@dataclass(frozen=True, slots=True)
class LoadedModel:
    id: str
    gpu_memory_mb: int = 0
    context_length: int | None = None
    quantization: str | None = None
    loaded_at: int | None = None


@dataclass(frozen=True, slots=True)
class LoadingModel:
    id: str
    progress: float = 0.0
    eta: float | None = None


@dataclass(frozen=True, slots=True)
class FailedModel:
    id: str
    error: str | None = None
    exit_code: int | None = None


@dataclass(frozen=True, slots=True)
class QueueView:
    depth: int = 0
    max_depth: int = 0
    avg_wait_ms: int = 0
    p95_wait_ms: int = 0
    running: int = 0
    forecast_wait_ms: Mapping[str, int] | None = None
    """The runner's own forecast per priority (`queue.forecastWaitMs`), when it sends one."""

    @property
    def full(self) -> bool:
        """A new request would be refused with 503 queue_full now."""
        return self.max_depth > 0 and self.depth >= self.max_depth

    def forecast_ms(self, priority: str = "normal") -> int:
        """The wait a new request of `priority` should expect.

        1. The runner's forecast for that priority, when it reports one.
        2. Otherwise queue depth x p95 wait (a pessimistic rule of thumb).
        """
        if self.forecast_wait_ms is not None and priority in self.forecast_wait_ms:  # 1
            return self.forecast_wait_ms[priority]
        return self.depth * self.p95_wait_ms  # 2


@dataclass(frozen=True, slots=True)
class Capabilities:
    runner_id: str
    runner_type: str
    health: str
    loaded: tuple[LoadedModel, ...] = ()
    loading: tuple[LoadingModel, ...] = ()
    available: tuple[str, ...] = ()
    failed: tuple[FailedModel, ...] = ()
    gpu_memory_total_mb: int = 0
    gpu_memory_used_mb: int = 0
    gpu_memory_free_mb: int = 0
    kv_cache_utilization: float = 0.0
    kv_cache_size_mb: int = 0
    memory_source: str | None = None
    queue: QueueView = field(default_factory=QueueView)
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def state_of(self, model: str) -> ModelState | None:
        """Where `model` stands on this runner; None if the runner does not offer it."""
        if any(m.id == model for m in self.loaded):
            return "loaded"
        if any(m.id == model for m in self.loading):
            return "loading"
        if any(m.id == model for m in self.failed):
            return "failed"
        if model in self.available:
            return "available"
        return None

    def loading_eta(self, model: str) -> float | None:
        return next((m.eta for m in self.loading if m.id == model), None)


def parse_capabilities(doc: object) -> Capabilities:
    """The view of one capabilities document (ValueError if its shape is wrong)."""
    top = _obj(doc, "capabilities")
    models = _obj(top.get("models", {}), "models")
    res = _obj(top.get("resources", {}), "resources")
    queue = _obj(top.get("queue", {}), "queue")
    forecast = queue.get("forecastWaitMs")
    if isinstance(forecast, int | float) and not isinstance(forecast, bool):
        forecast = dict.fromkeys(PRIORITIES, forecast)  # one figure for every priority
    return Capabilities(
        runner_id=str(top.get("runnerId", "")),
        runner_type=str(top.get("runnerType", "")),
        health=str(top.get("health", "unknown")),
        loaded=tuple(
            LoadedModel(
                str(m["id"]),
                _int(m.get("gpuMemoryMB")),
                _opt_int(m.get("contextLength")),
                _opt_str(m.get("quantization")),
                _opt_int(m.get("loadedAt")),
            )
            for m in _models(models.get("loaded"))
        ),
        loading=tuple(
            LoadingModel(str(m["id"]), _float(m.get("progress")), _opt_float(m.get("eta")))
            for m in _models(models.get("loading"))
        ),
        available=tuple(str(m) for m in models.get("available") or () if isinstance(m, str)),
        failed=tuple(
            FailedModel(str(m["id"]), _opt_str(m.get("error")), _opt_int(m.get("exitCode")))
            for m in _models(models.get("failed"))
        ),
        gpu_memory_total_mb=_int(res.get("gpuMemoryTotalMB")),
        gpu_memory_used_mb=_int(res.get("gpuMemoryUsedMB")),
        gpu_memory_free_mb=_int(res.get("gpuMemoryFreeMB")),
        kv_cache_utilization=_float(res.get("kvCacheUtilization")),
        kv_cache_size_mb=_int(res.get("kvCacheSizeMB")),
        memory_source=_opt_str(res.get("memorySource")),
        queue=QueueView(
            depth=_int(queue.get("depth")),
            max_depth=_int(queue.get("maxDepth")),
            avg_wait_ms=_int(queue.get("avgWaitMs")),
            p95_wait_ms=_int(queue.get("p95WaitMs")),
            running=_int(queue.get("running")),
            forecast_wait_ms=(
                {str(k): _int(v) for k, v in forecast.items()}
                if isinstance(forecast, dict)
                else None
            ),
        ),
        raw=top,
    )


def _obj(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what}: expected a JSON object, got {type(value).__name__}")
    return value


def _models(value: object) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        return []
    return [m for m in value if isinstance(m, dict) and isinstance(m.get("id"), str)]


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _int(value: object) -> int:
    number = _number(value)
    return round(number) if number is not None else 0


def _opt_int(value: object) -> int | None:
    number = _number(value)
    return round(number) if number is not None else None


def _float(value: object) -> float:
    number = _number(value)
    return number if number is not None else 0.0


def _opt_float(value: object) -> float | None:
    return _number(value)


def _opt_str(value: object) -> str | None:
    return value if isinstance(value, str) else None
