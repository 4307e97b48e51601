"""The `/v1/capabilities` document (pure): what this runner can do and how full it is.

The central router polls it every 5 s. Memory figures come from NVML on a GPU
(`memorySource: "nvml"`, `gpuIds` the devices); without one from the configured budget
(`memorySource: "budget"`, `gpuIds` empty: there is no GPU to name). Nothing is invented:
what the runner cannot know reads zero or null.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from runner import __version__
from runner.health import Life
from runner.pool.pool import ModelSlot
from runner.pool.states import ModelState
from runner.snapshot import ResourceSnapshot
from runner.tasks import LoadTask


def capabilities(
    runner_id: str,
    life: Life,
    models: Sequence[ModelSlot],
    queue: dict[str, int],
    multi_tenant: bool,
    prefix_caching: bool,
    *,
    loading: Mapping[str, LoadTask] | None = None,
    available: Sequence[str] = (),
    resources: ResourceSnapshot | None = None,
) -> dict[str, object]:
    """The document (pure): models from the pool's states and the load tasks' progress,
    resources from the latest snapshot (`runner/snapshot.py`, refreshed off the hot path)."""
    loading = loading or {}
    res = resources or ResourceSnapshot()
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
                {
                    "id": m.spec.id,
                    "progress": loading[m.spec.id].progress if m.spec.id in loading else 0.0,
                    "eta": loading[m.spec.id].eta if m.spec.id in loading else None,
                }
                for m in models
                if m.state is ModelState.LOADING
            ],
            "available": list(available) or sorted(m.spec.id for m in models),
            "failed": [
                {"id": m.spec.id, "error": m.error, "exitCode": m.exit_code}
                for m in models
                if m.state is ModelState.FAILED
            ],
        },
        "resources": {
            "gpuIds": [g.index for g in res.gpus if res.source == "nvml"],
            "gpuMemoryTotalMB": res.total_mb,
            "gpuMemoryUsedMB": res.used_mb,
            "gpuMemoryFreeMB": res.free_mb,
            "gpuUtilization": res.utilization,
            "kvCacheSizeMB": res.kv_mb,
            "kvCacheUtilization": res.kv_utilization,
            "memorySource": res.source,
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
