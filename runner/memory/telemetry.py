"""What the accelerators hold now: the `Telemetry` interface and its no-GPU implementation.

All figures are in MiB (written MB, as nvidia-smi and the seed write them).

Implementations:

- `NvmlTelemetry` (`runner/memory/nvml.py`): real GPUs through NVML.
- `BudgetTelemetry` (here): a machine without a GPU. One pseudo-device, index 0,
  whose total is a configured budget (`RUNNER_MEMORY_MB`) and whose use is what
  the runner's accounted leases say. Without a GPU, "measured" memory means the
  engine process tree's resident memory (see `runner/memory/proc.py`), not
  accelerator memory.
- `FakeTelemetry` (`tests/runner/memory/fake_telemetry.py`): several GPUs whose figures
  tests set.

Calls are synchronous and cheap (NVML answers in about a millisecond per GPU;
a /proc scan takes a few); code on the event loop may still run them in a
thread. `telemetry_from_settings` in `runner/memory/factory.py` picks one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from runner.memory.proc import PROC, tree_resident_mb


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One device at the moment of the snapshot.

    `index` is the device's NVML index (PCI bus order): the number to put in an
    engine's `CUDA_VISIBLE_DEVICES` when it runs with `CUDA_DEVICE_ORDER=PCI_BUS_ID`.
    `utilization` is the share of the last sample period the GPU was busy (0..1);
    None where the device cannot say (the budget pseudo-device).
    """

    index: int
    name: str
    total_mb: int
    used_mb: int
    free_mb: int
    utilization: float | None


@dataclass(frozen=True, slots=True)
class TelemetrySnapshot:
    """Every visible device, in index order; `source` names the implementation."""

    source: str
    gpus: tuple[GpuInfo, ...]

    def gpu(self, index: int) -> GpuInfo:
        for info in self.gpus:
            if info.index == index:
                return info
        raise KeyError(index)


class Telemetry(Protocol):
    def snapshot(self) -> TelemetrySnapshot:
        """Total, used and free memory and utilization of every visible device, now."""
        ...

    def process_used_mb(self, pids: Iterable[int]) -> int:
        """Memory used by `pids` and their descendants (accelerator memory on a GPU,
        resident host memory without one), in MiB."""
        ...

    def close(self) -> None: ...


BUDGET_DEVICE_NAME = "memory budget (no GPU)"


class BudgetTelemetry:
    """A machine without a GPU: one pseudo-device holding `budget_mb`.

    `measure` returns the MiB the runner has accounted (the sum of its leases);
    used is that figure and free is what is left of the budget, never below 0.
    `process_used_mb` is the resident memory (RSS, see proc.py) of the processes and
    all their descendants, read from /proc: without a GPU that is what an engine
    "measurably" holds.
    """

    def __init__(self, budget_mb: int, measure: Callable[[], int], proc: Path = PROC) -> None:
        if budget_mb < 1:
            raise ValueError(f"the memory budget must be at least 1 MB, not {budget_mb}")
        self.budget_mb = budget_mb
        self._measure = measure
        self._proc = proc

    def snapshot(self) -> TelemetrySnapshot:
        used = max(0, self._measure())
        device = GpuInfo(
            index=0,
            name=BUDGET_DEVICE_NAME,
            total_mb=self.budget_mb,
            used_mb=used,
            free_mb=max(0, self.budget_mb - used),
            utilization=None,
        )
        return TelemetrySnapshot(source="budget", gpus=(device,))

    def process_used_mb(self, pids: Iterable[int]) -> int:
        return tree_resident_mb(pids, self._proc)

    def close(self) -> None:
        return None
