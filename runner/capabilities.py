"""The `/v1/capabilities` document (pure): what this runner can do and how full it is.

The central router polls it every 5 s. Fields the runner cannot know yet (GPU
figures without NVML, loading models before lifecycle tasks exist) are
reported as empty or zero rather than invented.
"""

from __future__ import annotations

from collections.abc import Sequence

from runner import __version__
from runner.health import Life
from runner.pool.pool import ModelSlot
from runner.pool.states import ModelState


def capabilities(
    runner_id: str,
    life: Life,
    models: Sequence[ModelSlot],
    queue: dict[str, int],
    multi_tenant: bool,
    prefix_caching: bool,
) -> dict[str, object]:
    loaded = [m for m in models if m.state in (ModelState.READY, ModelState.DRAINING)]
    backends: list[str] = sorted({m.spec.backend for m in loaded}) or ["none"]
    return {
        "runnerType": f"quorum-{__version__} ({', '.join(backends)})",
        "runnerId": runner_id,
        "models": {
            "loaded": [
                {
                    "id": m.spec.id,
                    "quantization": m.params.quantization or m.spec.quantization,
                    "contextLength": m.params.max_context_length or m.spec.context_length,
                    "loadedAt": m.loaded_at,
                    "gpuMemoryMB": m.mem_mb,
                }
                for m in loaded
            ],
            "loading": [
                {"id": m.spec.id, "progress": 0.0, "eta": None}
                for m in models
                if m.state is ModelState.LOADING
            ],
            "available": sorted(m.spec.id for m in models),
            "failed": [
                {"id": m.spec.id, "error": m.error, "exitCode": m.exit_code}
                for m in models
                if m.state is ModelState.FAILED
            ],
        },
        "resources": {
            "gpuIds": [],
            "gpuMemoryTotalMB": 0,
            "gpuMemoryUsedMB": 0,
            "gpuMemoryFreeMB": 0,
            "gpuUtilization": 0.0,
            "kvCacheSizeMB": 0,
            "kvCacheUtilization": 0.0,
        },
        "queue": queue,
        "capabilities": {
            "streaming": True,
            "prefixCaching": prefix_caching,
            "multiTenant": multi_tenant,
            "visionInput": False,
            "audioInput": any(m.spec.backend == "faster-whisper" for m in models),
            "functionCalling": True,
        },
        "health": "healthy" if life is Life.READY else life.value,
    }
