"""Pick the runner's telemetry from its settings: NVML where a GPU answers, else a budget."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from runner.memory.nvml import NvmlLibrary, NvmlTelemetry, parse_visible_devices
from runner.memory.proc import PROC, mem_available_mb
from runner.memory.telemetry import BudgetTelemetry, Telemetry


def telemetry_from_settings(
    runner_memory_mb: int | None,
    cuda_visible_devices: str | None,
    *,
    measure: Callable[[], int],
    nvml: NvmlLibrary | None = None,
    proc: Path = PROC,
) -> Telemetry:
    """The telemetry for this machine.

    - runner_memory_mb: `RUNNER_MEMORY_MB`, the budget used when no GPU answers.
    - cuda_visible_devices: `CUDA_VISIBLE_DEVICES` as the runner was started with.
    - measure: MiB the runner has accounted (its leases), the budget device's use.
    - nvml: a stand-in for `pynvml` (tests); None imports the real one if installed.

    1. `CUDA_VISIBLE_DEVICES` naming no device (`""`, `"-1"`) → the budget.
    2. NVML loads and sees a GPU → `NvmlTelemetry` over the visible devices
       (`RUNNER_MEMORY_MB` is not used: the devices report their own totals).
    3. Otherwise → `BudgetTelemetry` of `RUNNER_MEMORY_MB`, or, when it is unset,
       of the machine's `MemAvailable` (/proc/meminfo) read once, now, at start:
       what the kernel could hand out without swapping before any model loads.
    """
    visible = parse_visible_devices(cuda_visible_devices)
    # 1. no device named
    no_device = visible is not None and not visible
    # 2. a GPU answers
    if not no_device and NvmlTelemetry.available(nvml):
        return NvmlTelemetry(visible, nvml=nvml, proc=proc)
    # 3. a budget
    budget = (
        runner_memory_mb if runner_memory_mb is not None else mem_available_mb(proc / "meminfo")
    )
    return BudgetTelemetry(budget, measure, proc=proc)
