"""Runner life states and what `/health` answers in each (pure).

    STARTING ──▶ READY ──▶ STOPPING
      503          200*       503

*READY answers 503 when every configured model has failed (models that are
merely absent do not make the runner unhealthy), and while the queue is
saturated (MAX_QUEUE_DEPTH requests waiting), as the seed asks: use /health as
a readiness probe (stop routing here for now), not as a liveness probe.

`Runtime.health()` is the one call: `/health`, capabilities' `health` and `/metrics`'
`quorum_health{status}` (runner/telemetry/state_metrics.py) all read it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Life(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"


STATUSES = ("healthy", "starting", "shutting_down", "unhealthy", "gpu_out_of_memory", "saturated")
"""Every `status` `health` can answer (`quorum_health{status}` exports one series each)."""


@dataclass(frozen=True, slots=True)
class HealthReport:
    status_code: int
    body: dict[str, object]


def health(
    life: Life,
    uptime_s: float,
    models_loaded: int,
    models_failed: int,
    queue_depth: int,
    max_queue_depth: int,
    *,
    gpu_out_of_memory: bool = False,
) -> HealthReport:
    """Decide the /health answer.

    1. Starting or stopping: 503 with that status.
    2. Models were configured and all of them failed: 503 "unhealthy".
    3. Every GPU is out of memory (NVML, from the latest snapshot): 503 "gpu_out_of_memory".
    4. The queue is saturated: 503 "saturated".
    5. Otherwise 200 "healthy".
    """
    body: dict[str, object] = {
        "status": "healthy",
        "uptime": int(uptime_s),
        "modelsLoaded": models_loaded,
        "queueDepth": queue_depth,
    }
    if life is not Life.READY:  # 1
        body["status"] = "starting" if life is Life.STARTING else "shutting_down"
        return HealthReport(503, body)
    if models_failed and not models_loaded:  # 2
        body["status"] = "unhealthy"
        return HealthReport(503, body)
    if gpu_out_of_memory:  # 3
        body["status"] = "gpu_out_of_memory"
        return HealthReport(503, body)
    if queue_depth >= max_queue_depth:  # 4
        body["status"] = "saturated"
        return HealthReport(503, body)
    return HealthReport(200, body)  # 5
