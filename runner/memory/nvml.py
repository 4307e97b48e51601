"""`NvmlTelemetry`: real GPUs through NVML (`pynvml`, from the `nvidia-ml-py` package).

`pynvml` is imported lazily, so the runner installs and runs without it; tests
pass a fake library object with the same functions instead of patching.

Indices are NVML's (PCI bus order). CUDA numbers devices fastest-first unless
`CUDA_DEVICE_ORDER=PCI_BUS_ID`, so engines must be started with that variable
for `CUDA_VISIBLE_DEVICES` built from these indices to name the same devices.

Per-process memory comes from `nvmlDeviceGetComputeRunningProcesses`, which
reports the driver's (host) pids: a runner inside a container without the
host's pid namespace sees none of its engines there, and reads 0.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

from runner.errors import ConfigError
from runner.memory.errors import MeasurementUnavailable, TelemetryUnavailable
from runner.memory.proc import PROC, process_tree
from runner.memory.telemetry import GpuInfo, TelemetrySnapshot

BYTES_PER_MIB = 1024 * 1024


class _MemoryInfo(Protocol):
    total: int
    free: int
    used: int


class _Utilization(Protocol):
    gpu: int


class _ProcessInfo(Protocol):
    pid: int
    usedGpuMemory: int | None  # NVML's spelling


class NvmlLibrary(Protocol):
    """The part of `pynvml` this module calls."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> object: ...
    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> object: ...
    def nvmlDeviceGetIndex(self, handle: object) -> int: ...
    def nvmlDeviceGetName(self, handle: object) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: object) -> _MemoryInfo: ...
    def nvmlDeviceGetUtilizationRates(self, handle: object) -> _Utilization: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> Sequence[_ProcessInfo]: ...


def parse_visible_devices(value: str | None) -> tuple[str, ...] | None:
    """`CUDA_VISIBLE_DEVICES` as the driver reads it: None when unset (every device).

    1. Unset → None: every device is visible.
    2. Split on commas; keep indices (`"0"`) and GPU UUIDs (`"GPU-..."`).
    3. Stop at the first entry that is neither (`""`, `"-1"`): CUDA ignores the rest,
       so `""` and `"-1"` mean no device at all.
    4. MIG instances (`"MIG-..."`) are refused: NVML's device figures would be the
       whole GPU's, not the slice's.
    """
    # 1. unset
    if value is None:
        return None
    kept: list[str] = []
    # 2. split
    for raw in value.split(","):
        entry = raw.strip()
        # 4. MIG
        if entry.startswith("MIG-"):
            raise ConfigError(
                f"CUDA_VISIBLE_DEVICES: MIG instance {entry!r} is not supported; "
                "name whole GPUs by index or GPU- UUID"
            )
        if entry.isdigit() or entry.startswith("GPU-"):
            kept.append(entry)
            continue
        # 3. first invalid entry ends the list
        break
    return tuple(kept)


def _import_pynvml() -> NvmlLibrary:
    import pynvml

    library: NvmlLibrary = pynvml
    return library


class NvmlTelemetry:
    """GPUs read through NVML; only the devices in `visible` (None: all of them).

    `visible` is `parse_visible_devices(CUDA_VISIBLE_DEVICES)`, passed in by the
    caller: this class reads no environment. NVML errors become
    `TelemetryUnavailable` in one place (`_nvml_errors`).
    """

    def __init__(
        self,
        visible: Sequence[str] | None = None,
        *,
        nvml: NvmlLibrary | None = None,
        proc: Path = PROC,
    ) -> None:
        self._nvml = nvml if nvml is not None else _import_pynvml()
        self._proc = proc
        with self._nvml_errors("nvmlInit"):
            self._nvml.nvmlInit()
        try:
            self._devices = self._resolve(visible)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def available(nvml: NvmlLibrary | None = None) -> bool:
        """True when NVML loads, initialises and finds at least one GPU."""
        try:
            library = nvml if nvml is not None else _import_pynvml()
        except ImportError:
            return False
        try:
            library.nvmlInit()
        except library.NVMLError:
            return False
        try:
            return library.nvmlDeviceGetCount() > 0
        except library.NVMLError:
            return False
        finally:
            with contextlib.suppress(library.NVMLError):
                library.nvmlShutdown()

    @contextlib.contextmanager
    def _nvml_errors(self, call: str) -> Iterator[None]:
        """The one place NVML's errors become ours."""
        try:
            yield
        except self._nvml.NVMLError as exc:
            raise TelemetryUnavailable(f"NVML {call} failed: {exc}") from exc

    def _resolve(self, visible: Sequence[str] | None) -> tuple[tuple[int, str, object], ...]:
        """(index, name, handle) of each visible device, in index order."""
        nvml = self._nvml
        devices: dict[int, tuple[int, str, object]] = {}
        with self._nvml_errors("device lookup"):
            if visible is None:
                handles = [
                    nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())
                ]
            else:
                handles = [
                    nvml.nvmlDeviceGetHandleByIndex(int(entry))
                    if entry.isdigit()
                    else nvml.nvmlDeviceGetHandleByUUID(entry)
                    for entry in visible
                ]
            for handle in handles:
                index = nvml.nvmlDeviceGetIndex(handle)
                name = nvml.nvmlDeviceGetName(handle)
                if isinstance(name, bytes):
                    name = name.decode(errors="replace")
                devices[index] = (index, name, handle)
        return tuple(devices[i] for i in sorted(devices))

    def snapshot(self) -> TelemetrySnapshot:
        gpus: list[GpuInfo] = []
        for index, name, handle in self._devices:
            with self._nvml_errors(f"memory info of GPU {index}"):
                memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                GpuInfo(
                    index=index,
                    name=name,
                    total_mb=memory.total // BYTES_PER_MIB,
                    used_mb=memory.used // BYTES_PER_MIB,
                    free_mb=memory.free // BYTES_PER_MIB,
                    utilization=self._utilization(handle),
                )
            )
        return TelemetrySnapshot(source="nvml", gpus=tuple(gpus))

    def _utilization(self, handle: object) -> float | None:
        """Busy share of the last sample period; None where the device does not report it."""
        try:
            return min(1.0, max(0.0, self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100))
        except self._nvml.NVMLError:  # NOT_SUPPORTED on some boards: unknown, not an outage
            return None

    def process_used_mb(self, pids: Iterable[int]) -> int:
        """GPU memory of `pids` and their descendants on the visible devices, in MiB.

        Raises `MeasurementUnavailable` when NVML lists one of them without a figure.
        """
        tree = process_tree(pids, self._proc)
        used_bytes = 0
        for index, _name, handle in self._devices:
            with self._nvml_errors(f"processes of GPU {index}"):
                processes = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            for process in processes:
                if process.pid not in tree:
                    continue
                if process.usedGpuMemory is None:
                    raise MeasurementUnavailable(
                        f"NVML does not report the memory of pid {process.pid} on GPU {index}"
                    )
                used_bytes += process.usedGpuMemory
        return used_bytes // BYTES_PER_MIB

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()
