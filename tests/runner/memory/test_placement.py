"""GpuPlacement on a fake 2-GPU machine: one GPU, a proportional split, or a reason."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runner.memory import (
    GpuFree,
    GpuPlacement,
    Lease,
    NoFit,
    account,
    cuda_visible_devices,
    free_gpus,
    place,
    tensor_split,
)
from tests.runner.memory.fake_telemetry import FakeTelemetry

GPU_MB = 24576


def _free(telemetry: FakeTelemetry, leases: list[Lease] | None = None) -> list[GpuFree]:
    return free_gpus(account(telemetry.snapshot().gpus, leases or []))


def test_placement_fits_one_gpu_best_fit() -> None:
    """A model that fits one GPU goes where it leaves the least room."""
    fake = FakeTelemetry([GPU_MB, GPU_MB]).use(0, 4000).use(1, 14000)
    result = place(8000, _free(fake))
    assert result == GpuPlacement((1,), {1: 8000})
    assert not result.split
    assert cuda_visible_devices(result) == "1"


def test_placement_most_free_policy_spreads() -> None:
    """policy="most_free" picks the GPU with the most room instead."""
    fake = FakeTelemetry([GPU_MB, GPU_MB]).use(0, 4000).use(1, 14000)
    assert place(8000, _free(fake), policy="most_free") == GpuPlacement((0,), {0: 8000})


def test_placement_ties_go_to_the_lower_index() -> None:
    """Two identical GPUs: GPU 0 is chosen, under either policy."""
    fake = FakeTelemetry([GPU_MB, GPU_MB])
    assert place(1000, _free(fake)).gpu_ids == (0,)  # type: ignore[union-attr]
    assert place(1000, _free(fake), policy="most_free").gpu_ids == (0,)  # type: ignore[union-attr]


def test_placement_keeps_the_margin_on_one_gpu() -> None:
    """Free memory equal to need + 512 fits; one MB less does not fit that GPU alone."""
    assert place(1000, [GpuFree(0, 1512)]) == GpuPlacement((0,), {0: 1000})
    assert isinstance(place(1000, [GpuFree(0, 1511)]), NoFit)


def test_placement_splits_in_proportion_to_free_memory() -> None:
    """Too big for either GPU: split in proportion to free memory, 512 MB left on each."""
    fake = FakeTelemetry([GPU_MB, GPU_MB]).use(0, 4576).use(1, 14576)  # 20000 and 10000 free
    result = place(24000, _free(fake))
    assert isinstance(result, GpuPlacement)
    assert result.gpu_ids == (0, 1)
    assert result.split
    assert sum(result.per_gpu_mb.values()) == 24000
    assert result.per_gpu_mb[0] <= 20000 - 512
    assert result.per_gpu_mb[1] <= 10000 - 512
    assert result.per_gpu_mb == {0: 16142, 1: 7858}  # 19488 : 9488 usable
    assert cuda_visible_devices(result) == "0,1"
    assert tensor_split(result) == "16142,7858"


def test_placement_split_uses_the_fewest_gpus() -> None:
    """A split takes the largest GPUs first and no more of them than needed."""
    gpus = [GpuFree(0, 6000), GpuFree(1, 20000), GpuFree(2, 12000)]
    result = place(25000, gpus)
    assert isinstance(result, GpuPlacement)
    assert result.gpu_ids == (1, 2)


def test_placement_impossible_names_need_and_free() -> None:
    """More than both GPUs hold: NoFit with the need, each GPU's room and the shortfall."""
    fake = FakeTelemetry([GPU_MB, GPU_MB]).use(0, 14576).use(1, 16576)  # 10000 and 8000 free
    result = place(30000, _free(fake))
    assert isinstance(result, NoFit)
    assert result.shortfall_mb == 30000 - 9488 - 7488
    assert "needs 30000 MB" in result.reason
    assert "GPU 0 9488 MB" in result.reason
    assert "GPU 1 7488 MB" in result.reason
    assert "512 MB margin" in result.reason
    assert f"{result.shortfall_mb} MB short" in result.reason


def test_placement_no_gpu_is_no_fit() -> None:
    """With no device at all the reason says so."""
    result = place(1000, [])
    assert isinstance(result, NoFit)
    assert "no GPU" in result.reason


def test_placement_counts_other_holders_leases() -> None:
    """A training job's lease, not yet allocated, pushes the model to the other GPU."""
    fake = FakeTelemetry([GPU_MB, GPU_MB]).use(1, 8000)
    training = Lease("training-job-7", {0: 20000}, 60.0)
    result = place(10000, _free(fake, [training]))
    assert result == GpuPlacement((1,), {1: 10000})


@given(
    need=st.integers(1, 200_000),
    free=st.lists(st.integers(0, 90_000), min_size=0, max_size=8),
    margin=st.integers(0, 2048),
)
def test_placement_property_shares_fit_and_sum(need: int, free: list[int], margin: int) -> None:
    """Any placement sums to the need with every share inside free - margin; NoFit only
    when all GPUs together lack the room."""
    gpus = [GpuFree(i, mb) for i, mb in enumerate(free)]
    usable = {g.index: max(0, g.free_mb - margin) for g in gpus}
    result = place(need, gpus, margin_mb=margin)
    if isinstance(result, NoFit):
        assert sum(usable.values()) < need
        assert result.shortfall_mb == need - sum(usable.values())
        return
    assert sum(result.per_gpu_mb.values()) == need
    assert list(result.gpu_ids) == sorted(result.per_gpu_mb)
    for index, share in result.per_gpu_mb.items():
        assert 0 < share <= usable[index]
    if result.split:
        assert max(usable.values()) < need
