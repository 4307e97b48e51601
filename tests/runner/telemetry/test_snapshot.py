"""The resource snapshot: capabilities, health and metrics read it, never the engines."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from adapters.features import NONE
from runner.memory.telemetry import GpuInfo
from runner.telemetry.capabilities import capabilities
from runner.telemetry.snapshot import ModelMemory, ResourceSnapshot, SnapshotCollector

GPUS = (
    GpuInfo(0, "gpu0", 80_000, 60_000, 20_000, 0.5),
    GpuInfo(1, "gpu1", 80_000, 80_000, 0, 0.9),
)
SNAP = ResourceSnapshot(
    1.0,
    "nvml",
    GPUS,
    (ModelMemory("a", 3000, 2000, 1000, 0.5), ModelMemory("b", 1000, 700, 300, 0.0)),
)


def test_snapshot_totals_and_kv_figures() -> None:
    """Totals add up over devices; KV utilization is weighted by each model's KV memory."""
    assert (SNAP.total_mb, SNAP.used_mb, SNAP.free_mb) == (160_000, 140_000, 20_000)
    assert SNAP.utilization == 0.7
    assert SNAP.kv_mb == 1300
    assert SNAP.kv_utilization == round(0.5 * 1000 / 1300, 3)


def test_snapshot_out_of_memory_only_when_every_device_is_full() -> None:
    """One full GPU of two is not out of memory; all full is."""
    assert not SNAP.out_of_memory()
    full = ResourceSnapshot(1.0, "nvml", (GPUS[1],))
    assert full.out_of_memory()
    assert not ResourceSnapshot().out_of_memory()


def test_capabilities_resources_come_from_the_snapshot() -> None:
    """The capabilities document carries the snapshot's device and KV figures."""
    doc = capabilities(
        "r", "healthy", {}, {}, {}, {"depth": 0}, True, lambda _spec: NONE, resources=SNAP
    )
    res = doc["resources"]
    assert isinstance(res, dict)
    assert res["gpuIds"] == [0, 1]
    assert res["gpuMemoryTotalMB"] == 160_000 and res["gpuMemoryFreeMB"] == 20_000
    assert res["kvCacheSizeMB"] == 1300


def test_snapshot_collector_exports_memory_in_bytes() -> None:
    """GPU memory per device and each model's weights/KV split are exported in bytes."""
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: SNAP))
    text = generate_latest(registry).decode()
    assert 'quorum_gpu_memory_used_bytes{gpu="0"} 6.291456e+10' in text
    assert 'quorum_model_memory_bytes{kind="weights",model="a"}' in text
    assert 'quorum_model_memory_bytes{kind="kv_cache",model="b"} 3.145728e+08' in text
