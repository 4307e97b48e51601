"""Capabilities documents in the runner's shape, for the client's tests without a network."""

from __future__ import annotations

from typing import Any


def caps(
    runner_id: str = "r",
    *,
    loaded: tuple[str, ...] = (),
    loading: tuple[tuple[str, float], ...] = (),
    available: tuple[str, ...] = (),
    failed: tuple[str, ...] = (),
    depth: int = 0,
    max_depth: int = 16,
    p95: int = 0,
    kv: float = 0.0,
    free_mb: int = 1000,
    health: str = "healthy",
    forecast: dict[str, int] | None = None,
) -> dict[str, Any]:
    """A capabilities document as runner/telemetry/capabilities.py writes it."""
    queue: dict[str, Any] = {
        "depth": depth,
        "maxDepth": max_depth,
        "avgWaitMs": p95 // 2,
        "p95WaitMs": p95,
        "running": 0,
    }
    if forecast is not None:
        queue["forecastWaitMs"] = forecast
    return {
        "runnerType": "llama-server-11434.0.0",
        "runnerId": runner_id,
        "models": {
            "loaded": [
                {
                    "id": m,
                    "quantization": None,
                    "contextLength": 512,
                    "loadedAt": 1,
                    "gpuMemoryMB": 300,
                }
                for m in loaded
            ],
            "loading": [{"id": m, "progress": 0.5, "eta": eta} for m, eta in loading],
            "available": sorted({*available, *loaded, *(m for m, _ in loading)}),
            "failed": [{"id": m, "error": "exit 1", "exitCode": 1} for m in failed],
        },
        "resources": {
            "gpuIds": [],
            "gpuMemoryTotalMB": 2000,
            "gpuMemoryUsedMB": 2000 - free_mb,
            "gpuMemoryFreeMB": free_mb,
            "gpuUtilization": 0.0,
            "kvCacheSizeMB": 100,
            "kvCacheUtilization": kv,
            "memorySource": "budget",
        },
        "queue": queue,
        "capabilities": {
            "streaming": True,
            "prefixCaching": True,
            "multiTenant": True,
            "visionInput": False,
            "audioInput": False,
            "functionCalling": False,
        },
        "health": health,
    }
