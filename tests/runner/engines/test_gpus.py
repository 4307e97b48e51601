"""The pool places engines on GPUs from the telemetry (a fake 2-GPU machine here) and
leases what they hold, so other users of the state store count it."""

from __future__ import annotations

import sys

import pytest

from runner.engines.pool import ModelPool
from runner.floor.models_file import ModelSpec
from runner.floor.settings import load_settings
from runner.memory.leases import MemoryLeaseStore
from tests.runner.engines.support import load, make_pool
from tests.runner.memory.fake_telemetry import FakeTelemetry
from tests.support.runner_proc import fixture_bin


def _pool(telemetry: FakeTelemetry, vram_mb: int) -> ModelPool:
    spec = ModelSpec(
        id="big",
        backend="llama-server",
        path="/dev/null",
        vram_mb=vram_mb,
        bin=fixture_bin("llama-server-ok"),
    )
    settings = load_settings({"RUNNER_ID": "r1", "FAKE_ENGINE_PYTHON": sys.executable})
    return make_pool(settings, [spec], telemetry, leases=MemoryLeaseStore(lambda: 0.0))


@pytest.fixture(autouse=True)
def _engine_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_ENGINE_PYTHON", sys.executable)


async def test_pool_splits_a_model_larger_than_one_gpu() -> None:
    """15 GB on two 10 GB GPUs: both listed in CUDA_VISIBLE_DEVICES, --tensor-split set."""
    telemetry = FakeTelemetry([10_000, 10_000]).use(0, 2_000)
    pool = _pool(telemetry, 15_000)
    assert (await load(pool, "big"))[0] == "ready"
    process = pool.records["big"].process
    assert process is not None
    assert process.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert process.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    argv = list(process.argv)
    shares = [int(x) for x in argv[argv.index("--tensor-split") + 1].split(",")]
    assert sum(shares) == 15_000 and shares[0] < shares[1]  # GPU 0 had less free
    await pool.close()


async def test_pool_fits_one_gpu_without_split() -> None:
    """A model that fits one GPU goes on one (best fit), no --tensor-split."""
    telemetry = FakeTelemetry([10_000, 24_000]).use(1, 4_000)
    pool = _pool(telemetry, 8_000)
    assert (await load(pool, "big"))[0] == "ready"
    process = pool.records["big"].process
    assert process is not None and process.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert "--tensor-split" not in process.argv
    await pool.close()


async def test_pool_no_fit_names_the_figures() -> None:
    """More than both GPUs can hold: the load fails naming the need and the free figures."""
    pool = _pool(FakeTelemetry([10_000, 10_000]), 30_000)
    outcome = await load(pool, "big")
    assert outcome[:2] == ("failed", "big") and "30000" in outcome[2]


async def test_pool_leases_count_other_holders() -> None:
    """Another holder's lease in the store lowers the memory free for loads."""
    telemetry = FakeTelemetry([10_000])
    pool = _pool(telemetry, 1_000)
    await pool.gpus.leases.acquire("training-job", {0: 6_000}, 60)
    await pool.hold_leases()
    assert pool.free_memory_mb() == 4_000
    assert (await load(pool, "big"))[0] == "ready"
    telemetry.process_mb[pool.records["big"].process.pid] = 1_000  # type: ignore[union-attr]
    pool.records["big"].mem_mb = 1_000
    await pool.hold_leases()
    holders = {lease.holder: dict(lease.gpu_mb) for lease in await pool.gpus.leases.all()}
    assert holders["r1/big"] == {0: 1_000} and holders["training-job"] == {0: 6_000}
    await pool.close()
