"""Load tasks follow the scheduler's notices (runner/lifecycle/loads.py): no polling loop, so a
task is completed by the very event that makes its model ready, on a clock that never
moves; progress while loading is computed when read, not written."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest

from faults import QuorumError
from runner.engines.kinds import EngineKinds
from runner.engines.specs import ModelSpecs
from runner.floor.models_file import ModelSpec
from runner.lifecycle.catalog import Roots
from runner.lifecycle.governed import GovernedRequest
from runner.lifecycle.loads import LoadManager
from runner.scheduler import ModelPolicy, SchedulerAdmission, SchedulerConfig
from runner.tasks import LoadTask, MemoryTaskStore, TaskStatus, TaskStoreUnavailable
from runner.tasks.eta import EtaEstimator, LoadSpeed
from tests.runner.scheduler.fakes import state
from tests.support.poll import eventually_async

pytestmark = pytest.mark.timeout(10)

GGUF_MB = 10


@dataclass
class FakePool:
    """The pool as the scheduler sees it: it starts what it is told (recording it) and
    answers nothing by itself; the test reports for it."""

    started: list[str] = field(default_factory=list)

    def start_load(self, model: str, policy: ModelPolicy) -> None:
        self.started.append(model)

    def stop_model(self, model: str, sleep: bool, cut: QuorumError | None = None) -> None:
        return None

    def free_memory_mb(self) -> int:
        return 10_000

    def log_decision(self, text: str) -> None:
        return None


class Approve:
    async def approve(self, operation: str, request: GovernedRequest) -> None:
        return None


class CountingStore(MemoryTaskStore):
    """The memory store, counting what is written; `down` makes it unreachable."""

    def __init__(self) -> None:
        super().__init__(lambda: 1000.0)
        self.writes: list[LoadTask] = []
        self.down = False

    async def put(self, task: LoadTask) -> LoadTask:
        if self.down:
            raise TaskStoreUnavailable(detail="ConnectionError", retry_after=1)
        self.writes.append(task)
        return await super().put(task)

    async def get(self, task_id: str) -> LoadTask | None:
        if self.down:
            raise TaskStoreUnavailable(detail="ConnectionError", retry_after=1)
        return await super().get(task_id)


@dataclass
class Setup:
    loads: LoadManager
    admission: SchedulerAdmission
    pool: FakePool
    store: CountingStore
    clock: list[float]


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    gguf = tmp_path / "g.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * (GGUF_MB * 2**20))
    spec = ModelSpec(id="g", backend="llama-server", path=str(gguf))
    specs = ModelSpecs([spec], EngineKinds(), lambda _gpus: None)
    pool = FakePool()
    clock = [1000.0]
    admission = SchedulerAdmission(
        SchedulerConfig(unlisted_ready=False),
        clock=lambda: clock[0],
        tick_interval_s=3600,
        models=pool,
    )
    store = CountingStore()
    roots = Roots(tmp_path, None, (tmp_path,))
    loads = LoadManager(
        specs,
        admission,
        Approve(),  # type: ignore[arg-type]
        store,
        roots,
        EtaEstimator(defaults={"llama-server": LoadSpeed(2.0, 10.0)}),
        "r1",
        clock=lambda: clock[0],
        cancel_check_s=0.01,
        store_retry_s=0.01,
    )
    await admission.start()
    await loads.start()
    yield Setup(loads, admission, pool, store, clock)
    await loads.aclose()
    await admission.stop()


def _body(model: str = "g") -> bytes:
    return orjson.dumps({"modelId": model, "verifiedOpToken": "t"})


async def _settled() -> None:
    """Let the tasks that are runnable now run (no time passes: the clock is fake)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def test_loads_task_completes_on_the_ready_event(setup: Setup) -> None:
    """The engine's ready report completes the task at once: written loading when the
    load starts, completed when ready, nothing in between, no time passing."""
    task = await setup.loads.submit(_body(), None)
    await _settled()
    assert setup.pool.started == ["g"]
    assert [t.status for t in setup.store.writes] == [TaskStatus.LOADING]
    setup.admission.model_ready("g", 1, 123)
    await _settled()
    done = await setup.loads.get(task.task_id)
    assert done.status is TaskStatus.COMPLETED and done.gpu_memory_used_mb == 123
    assert [t.status for t in setup.store.writes] == [TaskStatus.LOADING, TaskStatus.COMPLETED]


async def test_loads_progress_advances_with_time_when_read(setup: Setup) -> None:
    """While loading, progress and eta move with the clock on every read, with no writes;
    the predicted load time (3 s here) is the first eta."""
    task = await setup.loads.submit(_body(), None)
    await _settled()
    first = await setup.loads.get(task.task_id)
    assert (first.progress, first.eta) == (0.0, 3.0)
    setup.clock[0] += 1.5
    later = await setup.loads.get(task.task_id)
    assert 0.4 < later.progress < 0.6 and later.eta is not None and later.eta < 3.0
    assert setup.loads.progress()["g"].progress == later.progress
    assert len(setup.store.writes) == 1


async def test_loads_failure_and_refusal_end_the_task(setup: Setup) -> None:
    """A failed start fails the task with the reason; a load that can never fit fails at
    once saying so."""
    task = await setup.loads.submit(_body(), None)
    await _settled()
    setup.admission.load_failed("g", "engine exited while starting (exit code 1)", 1)
    await _settled()
    failed = await setup.loads.get(task.task_id)
    assert failed.status is TaskStatus.FAILED and "exit code 1" in (failed.error or "")
    setup.pool.free_memory_mb = lambda: 0  # type: ignore[method-assign]
    task = await setup.loads.submit(_body(), None)
    await _settled()
    refused = await setup.loads.get(task.task_id)
    assert refused.status is TaskStatus.FAILED and "does not fit" in (refused.error or "")


async def test_loads_cancel_calls_the_load_off(setup: Setup) -> None:
    """Cancelling a task stops waiting at once and calls the load off at the scheduler."""
    task = await setup.loads.submit(_body(), None)
    await _settled()
    cancelled = await setup.loads.cancel(task.task_id, b"", "token")
    await _settled()
    assert cancelled.status is TaskStatus.CANCELLED
    assert state(setup.admission.core, "g") == "stopping"


async def test_loads_cancel_on_another_replica_stops_the_load(setup: Setup) -> None:
    """A cancel another replica writes in the store is seen by the owner while its engine
    starts (it reads its task every `cancel_check_s`): the load is called off here."""
    task = await setup.loads.submit(_body(), None)
    await _settled()
    await setup.store.put(task.cancel(now=setup.clock[0]))  # as replica r2 does
    await eventually_async(lambda: state(setup.admission.core, "g") == "stopping")
    assert (await setup.loads.get(task.task_id)).status is TaskStatus.CANCELLED


async def test_loads_cancel_on_another_replica_after_ready_unloads(setup: Setup) -> None:
    """A model that became ready before the owner saw another replica's cancel is unloaded
    (the cancel frees what the load took); the task stays cancelled."""
    task = await setup.loads.submit(_body(), None)
    await _settled()
    await setup.store.put(task.cancel(now=setup.clock[0]))
    setup.admission.model_ready("g", 1, 123)  # before the owner's next read of its task
    await eventually_async(lambda: state(setup.admission.core, "g") != "ready")
    assert state(setup.admission.core, "g") in ("draining", "stopping")
    assert (await setup.loads.get(task.task_id)).status is TaskStatus.CANCELLED


async def test_loads_outcome_written_once_the_store_is_back(setup: Setup) -> None:
    """A load that ends while the store is down goes on and reads its outcome once the
    store answers again (the refused write is retried, not lost)."""
    task = await setup.loads.submit(_body(), None)
    await _settled()
    setup.store.down = True
    setup.admission.model_ready("g", 1, 123)
    await _settled()
    assert [t.status for t in setup.store.writes] == [TaskStatus.LOADING]
    setup.store.down = False
    await eventually_async(lambda: len(setup.store.writes) == 2)
    done = await setup.loads.get(task.task_id)
    assert done.status is TaskStatus.COMPLETED and done.gpu_memory_used_mb == 123
