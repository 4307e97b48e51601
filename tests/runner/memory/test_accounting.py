"""Free memory per GPU from the device's figures and every holder's leases."""

from __future__ import annotations

from runner.memory import BudgetTelemetry, GpuAccount, Lease, account, overcommitted
from tests.runner.memory.fake_telemetry import FakeTelemetry

GPU_MB = 24576


def _accounts(fake: FakeTelemetry, *leases: Lease) -> tuple[GpuAccount, ...]:
    return account(fake.snapshot().gpus, leases)


def test_accounting_loaded_engine_counted_once() -> None:
    """An engine that leased 10000 MB and allocated them is not subtracted twice."""
    fake = FakeTelemetry([GPU_MB]).use(0, 10000)
    (gpu,) = _accounts(fake, Lease("runner:llama", {0: 10000}, 30))
    assert gpu == GpuAccount(0, GPU_MB, GPU_MB - 10000, 10000, GPU_MB - 10000)


def test_accounting_lease_not_yet_allocated_counts() -> None:
    """A training job that leased but has not allocated yet still takes its room."""
    fake = FakeTelemetry([GPU_MB])
    (gpu,) = _accounts(fake, Lease("training-job", {0: 16000}, 30))
    assert gpu.free_mb == GPU_MB - 16000


def test_accounting_user_without_lease_counts() -> None:
    """Memory used by a process holding no lease is seen through the device's figure."""
    fake = FakeTelemetry([GPU_MB]).use(0, 6000)
    (gpu,) = _accounts(fake)
    assert gpu.free_mb == GPU_MB - 6000


def test_accounting_sums_every_holder_per_gpu() -> None:
    """Leases of several holders on several GPUs add up per GPU."""
    fake = FakeTelemetry([GPU_MB, GPU_MB])
    first, second = _accounts(
        fake,
        Lease("runner:big", {0: 8000, 1: 8000}, 30),
        Lease("training-job", {1: 4000}, 30),
    )
    assert (first.leased_mb, first.free_mb) == (8000, GPU_MB - 8000)
    assert (second.leased_mb, second.free_mb) == (12000, GPU_MB - 12000)


def test_accounting_never_negative_and_ignores_hidden_gpus() -> None:
    """Leases above the total read as 0 free; leases on GPUs not visible are ignored."""
    fake = FakeTelemetry([GPU_MB])
    (gpu,) = _accounts(fake, Lease("a", {0: 30000}, 30), Lease("b", {5: 1000}, 30))
    assert gpu.free_mb == 0


def test_accounting_budget_is_budget_minus_every_lease() -> None:
    """Without a GPU: the budget minus our accounted use and other holders' leases."""
    ours = [Lease("runner:small", {0: 2000}, 30)]
    telemetry = BudgetTelemetry(16000, lambda: sum(lease.gpu_mb[0] for lease in ours))
    (gpu,) = account(telemetry.snapshot().gpus, [*ours, Lease("job", {0: 5000}, 30)])
    assert gpu.free_mb == 16000 - 2000 - 5000


def test_accounting_overcommitted_after_a_race() -> None:
    """Two holders that placed on the same room find the GPU overcommitted."""
    gpus = FakeTelemetry([GPU_MB, GPU_MB]).snapshot().gpus
    leases = [Lease("a", {0: 14000}, 30), Lease("b", {0: 10500}, 30), Lease("c", {1: 500}, 30)]
    assert overcommitted(gpus, leases) == [0]
    assert overcommitted(gpus, leases[:1]) == []
