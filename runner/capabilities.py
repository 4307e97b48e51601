"""The `/v1/capabilities` document (pure): what this runner can do and how full it is.

The central router polls it every 5 s. Fields the runner cannot know yet (GPU
figures without NVML, loading models before lifecycle tasks exist) are
reported as empty or zero rather than invented.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner import __version__
from runner.health import Life
from runner.models_config import ModelSpec


@dataclass(frozen=True, slots=True)
class LoadedModel:
    spec: ModelSpec
    loaded_at: int


def capabilities(
    runner_id: str,
    life: Life,
    loaded: list[LoadedModel],
    queue: dict[str, int],
    multi_tenant: bool,
    prefix_caching: bool,
) -> dict[str, object]:
    backends: list[str] = sorted({m.spec.backend for m in loaded}) or ["none"]
    return {
        "runnerType": f"quorum-{__version__} ({', '.join(backends)})",
        "runnerId": runner_id,
        "models": {
            "loaded": [
                {
                    "id": m.spec.id,
                    "quantization": None,
                    "contextLength": m.spec.context_length,
                    "loadedAt": m.loaded_at,
                    "gpuMemoryMB": m.spec.vram_mb or 0,
                }
                for m in loaded
            ],
            "loading": [],
            "available": [],
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
            "audioInput": False,
            "functionCalling": True,
        },
        "health": "healthy" if life is Life.READY else life.value,
    }
