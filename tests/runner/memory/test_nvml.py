"""NVML telemetry over a stand-in library, and NVML's absence on this machine."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.errors import ConfigError
from runner.memory import (
    MeasurementUnavailable,
    NvmlTelemetry,
    TelemetryUnavailable,
    parse_visible_devices,
)
from tests.runner.memory.fake_nvml import GIB, FakeNvml

MIB = 1024 * 1024


@pytest.fixture
def child() -> Iterator[int]:
    """A real child of this test process, so the pid tree has a descendant."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    yield proc.pid
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(10)


def test_nvml_unavailable_on_this_machine() -> None:
    """Here there is no GPU: available() is False (pynvml missing or nvmlInit failing)."""
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver")
    assert NvmlTelemetry.available() is False


def test_nvml_unavailable_when_init_fails_or_no_gpu() -> None:
    """available() is False when nvmlInit raises or NVML counts no device, True otherwise."""
    assert NvmlTelemetry.available(FakeNvml([80], init_fails=True)) is False
    assert NvmlTelemetry.available(FakeNvml([])) is False
    nvml = FakeNvml([80])
    assert NvmlTelemetry.available(nvml) is True
    assert nvml.inits == 0  # initialised, then shut down again


def test_nvml_snapshot_in_mib_and_fractions() -> None:
    """Bytes become MiB, utilization percent becomes 0..1, names are text."""
    nvml = FakeNvml([80, 80])
    nvml.devices[0].used = 10 * GIB
    nvml.devices[0].utilization = 35
    nvml.devices[1].utilization = None
    telemetry = NvmlTelemetry(nvml=nvml)
    first, second = telemetry.snapshot().gpus
    assert (first.index, first.name, first.total_mb, first.used_mb, first.free_mb) == (
        0,
        "Fake H100",
        81920,
        10240,
        71680,
    )
    assert first.utilization == pytest.approx(0.35)
    assert second.utilization is None
    telemetry.close()
    assert nvml.inits == 0


def test_nvml_respects_visible_devices_by_index_and_uuid() -> None:
    """Only the devices CUDA_VISIBLE_DEVICES names are reported, in index order."""
    nvml = FakeNvml([80, 80, 80, 80])
    telemetry = NvmlTelemetry(parse_visible_devices("3,GPU-fake-1"), nvml=nvml)
    assert [g.index for g in telemetry.snapshot().gpus] == [1, 3]


def test_nvml_unknown_visible_device_is_unavailable() -> None:
    """A visible index NVML does not know fails construction with TelemetryUnavailable."""
    nvml = FakeNvml([80])
    with pytest.raises(TelemetryUnavailable, match="device lookup"):
        NvmlTelemetry(("4",), nvml=nvml)
    assert nvml.inits == 0


def test_nvml_process_memory_covers_descendants(child: int) -> None:
    """GPU memory of a pid counts its descendants on every visible GPU, and no one else's."""
    nvml = FakeNvml([80, 80])
    nvml.devices[0].processes = [(os.getpid(), 1000 * MIB), (child, 3000 * MIB)]
    nvml.devices[1].processes = [(child, 2000 * MIB), (2**22 + 7, 9000 * MIB)]
    telemetry = NvmlTelemetry(nvml=nvml)
    assert telemetry.process_used_mb([os.getpid()]) == 6000
    assert telemetry.process_used_mb([child]) == 5000


def test_nvml_process_memory_not_reported_is_an_error() -> None:
    """NVML listing our process without a figure raises MeasurementUnavailable, not 0."""
    nvml = FakeNvml([80])
    nvml.devices[0].processes = [(os.getpid(), None)]
    telemetry = NvmlTelemetry(nvml=nvml)
    with pytest.raises(MeasurementUnavailable):
        telemetry.process_used_mb([os.getpid()])


def test_nvml_errors_become_telemetry_unavailable() -> None:
    """An NVML failure mid-run surfaces as TelemetryUnavailable (503)."""
    nvml = FakeNvml([80])
    telemetry = NvmlTelemetry(nvml=nvml)
    nvml.broken = {"nvmlDeviceGetMemoryInfo", "nvmlDeviceGetComputeRunningProcesses"}
    with pytest.raises(TelemetryUnavailable) as info:
        telemetry.snapshot()
    assert info.value.status == 503
    with pytest.raises(TelemetryUnavailable):
        telemetry.process_used_mb([os.getpid()])


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", ()),
        ("-1", ()),
        ("0,1", ("0", "1")),
        (" 2 , 0 ", ("2", "0")),
        ("0,-1,1", ("0",)),
        ("GPU-abc,1", ("GPU-abc", "1")),
    ],
)
def test_parse_visible_devices_as_cuda_reads_it(
    value: str | None, expected: tuple[str, ...] | None
) -> None:
    """CUDA_VISIBLE_DEVICES: unset is all, an invalid entry ends the list."""
    assert parse_visible_devices(value) == expected


def test_parse_visible_devices_refuses_mig() -> None:
    """MIG instances are refused with a ConfigError naming the setting."""
    with pytest.raises(ConfigError, match="MIG"):
        parse_visible_devices("0,MIG-1234")
