"""A stand-in for the `pynvml` module: the same functions, over GPUs the test describes."""

from __future__ import annotations

from dataclasses import dataclass, field

GIB = 1024**3


class FakeNVMLError(Exception):
    """pynvml.NVMLError's stand-in."""


@dataclass
class MemoryInfo:
    total: int
    free: int
    used: int


@dataclass
class Utilization:
    gpu: int


@dataclass
class ProcessInfo:
    pid: int
    usedGpuMemory: int | None


@dataclass
class FakeDevice:
    index: int
    total: int
    used: int = 0
    utilization: int | None = 0  # percent; None: NOT_SUPPORTED
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes)

    @property
    def uuid(self) -> str:
        return f"GPU-fake-{self.index}"


def _device(handle: object) -> FakeDevice:
    assert isinstance(handle, FakeDevice)
    return handle


class FakeNvml:
    """GPUs of the given sizes in GiB. `broken` names functions that raise NVMLError."""

    NVMLError: type[Exception] = FakeNVMLError

    def __init__(self, sizes_gib: list[int], *, init_fails: bool = False) -> None:
        self.devices = [FakeDevice(i, size * GIB) for i, size in enumerate(sizes_gib)]
        self.init_fails = init_fails
        self.broken: set[str] = set()
        self.inits = 0

    def _maybe_fail(self, name: str) -> None:
        if name in self.broken:
            raise FakeNVMLError(f"{name}: GPU is lost")

    def nvmlInit(self) -> None:
        if self.init_fails:
            raise FakeNVMLError("NVML Shared Library Not Found")
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.inits -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        self._maybe_fail("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.devices):
            raise FakeNVMLError("Invalid Argument")
        return self.devices[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> object:
        for device in self.devices:
            if device.uuid == uuid:
                return device
        raise FakeNVMLError("Not Found")

    def nvmlDeviceGetIndex(self, handle: object) -> int:
        return _device(handle).index

    def nvmlDeviceGetName(self, handle: object) -> str | bytes:
        return b"Fake H100"  # old pynvml versions return bytes

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> MemoryInfo:
        self._maybe_fail("nvmlDeviceGetMemoryInfo")
        device = _device(handle)
        return MemoryInfo(total=device.total, free=device.total - device.used, used=device.used)

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> Utilization:
        device = _device(handle)
        if device.utilization is None:
            raise FakeNVMLError("Not Supported")
        return Utilization(gpu=device.utilization)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[ProcessInfo]:
        self._maybe_fail("nvmlDeviceGetComputeRunningProcesses")
        return [ProcessInfo(pid, used) for pid, used in _device(handle).processes]
