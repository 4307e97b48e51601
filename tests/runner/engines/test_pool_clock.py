"""The pool measures load time, and expires its default leases, on the clock it is given."""

from __future__ import annotations

import sys

import pytest

from runner.engines.pool import ModelPool, NoObserver
from runner.floor.models_file import ModelSpec
from runner.floor.settings import load_settings
from runner.memory.leases import LeaseStore, MemoryLeaseStore
from tests.runner.engines.support import load, make_pool
from tests.runner.memory.fake_telemetry import FakeTelemetry
from tests.support.runner_proc import fixture_bin

pytestmark = pytest.mark.timeout(30)


class TickingClock:
    """A monotonic clock that moves `step` seconds each time it is read."""

    def __init__(self, step: float) -> None:
        self.now = 500.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


class Loads(NoObserver):
    """The load times the pool reports."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, float]] = []

    def loaded(self, spec: ModelSpec, seconds: float) -> None:
        self.seen.append((spec.backend, seconds))


def _pool(
    monotonic: TickingClock, leases: LeaseStore | None = None, observer: Loads | None = None
) -> ModelPool:
    spec = ModelSpec(
        id="m", backend="llama-server", path="/dev/null", bin=fixture_bin("llama-server-ok")
    )
    settings = load_settings({"RUNNER_ID": "r1", "FAKE_ENGINE_PYTHON": sys.executable})
    return make_pool(
        settings,
        [spec],
        FakeTelemetry([10_000]),
        clock=lambda: 1_700_000_000.0,
        monotonic=monotonic,
        leases=leases,
        observer=observer,
    )


@pytest.fixture(autouse=True)
def _engine_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_ENGINE_PYTHON", sys.executable)


async def test_pool_load_time_is_read_on_the_injected_clock() -> None:
    """The load time the pool reports is the injected clock's (read once before the
    launch and once after: one 7.25 s tick), not the machine's; `loadedAt` is the wall
    clock's."""
    loads = Loads()
    pool = _pool(TickingClock(step=7.25), leases=MemoryLeaseStore(lambda: 0.0), observer=loads)
    assert (await load(pool, "m"))[0] == "ready"
    assert loads.seen == [("llama-server", 7.25)]
    assert pool.records["m"].loaded_at == 1_700_000_000
    await pool.close()


async def test_pool_default_leases_expire_on_the_injected_clock() -> None:
    """Without a lease store given, the pool's leases expire when the injected clock says."""
    clock = TickingClock(step=0.0)
    pool = _pool(clock)
    leases = pool.gpus.leases
    await leases.acquire("training-job", {0: 6_000}, 60)
    assert [lease.holder for lease in await leases.all()] == ["training-job"]
    clock.now += 61
    assert await leases.all() == []
    await pool.close()
