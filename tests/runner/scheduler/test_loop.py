"""`SchedulerAdmission`: the core behind the Admission seam, on a real event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from faults import QuorumError
from runner.scheduler import (
    QueueFull,
    QueueTimeout,
    SchedulerAdmission,
    SchedulerConfig,
    SchedulerStopped,
)
from runner.scheduler.config import ModelPolicy
from runner.scheduler.effects import ModelNotice
from runner.scheduler.grants import AdmissionRequest, Grant, Usage
from runner.scheduler.models import ModelState
from tests.runner.scheduler.fakes import state


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class RecordingObserver:
    queued: list[str] = field(default_factory=list)
    granted: list[tuple[str, float]] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    on_grant: Callable[[str], None] | None = None

    def on_queued(self, tenant: str, priority: str) -> None:
        self.queued.append(tenant)

    def on_granted(self, tenant: str, priority: str, wait_s: float) -> None:
        self.granted.append((tenant, wait_s))
        if self.on_grant is not None:
            self.on_grant(tenant)

    def on_rejected(self, reason: str, tenant: str) -> None:
        self.rejected.append((reason, tenant))


def request(tenant: str, priority: str = "normal") -> AdmissionRequest:
    return AdmissionRequest(f"req-{tenant}", "m", tenant, priority, 10, 10)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def observer() -> RecordingObserver:
    return RecordingObserver()


@pytest.fixture
async def admission(
    clock: FakeClock, observer: RecordingObserver
) -> AsyncIterator[SchedulerAdmission]:
    config = SchedulerConfig(default_concurrency=1, max_queue_depth=2, queue_timeout_s=30.0)
    adm = SchedulerAdmission(config, clock=clock, tick_interval_s=3600, observer=observer)
    await adm.start()
    yield adm
    await adm.stop()


async def queued(admission: SchedulerAdmission, tenant: str) -> asyncio.Task[Grant]:
    task = asyncio.create_task(admission.acquire(request(tenant)))
    await asyncio.sleep(0)  # acquire runs up to its await: its request was handled
    assert not task.done()  # and waits
    return task


async def test_admission_grants_then_hands_the_slot_on(
    admission: SchedulerAdmission, clock: FakeClock
) -> None:
    """A release lets the next waiter in, with its measured queue wait."""
    first = await admission.acquire(request("a"))
    second = await queued(admission, "b")
    assert admission.queue_depth() == 1
    clock.now += 1.5
    admission.release(first, Usage(10, 5))
    grant = await second
    assert (first.queue_wait_ms, grant.queue_wait_ms) == (0, 1500)
    stats = admission.stats().capabilities()
    assert {key: stats[key] for key in ("depth", "maxDepth", "avgWaitMs", "p95WaitMs")} == {
        "depth": 0,
        "maxDepth": 2,
        "avgWaitMs": 750,
        "p95WaitMs": 1500,
    }


async def test_admission_cancel_while_queued_withdraws(
    admission: SchedulerAdmission, observer: RecordingObserver
) -> None:
    """A caller cancelled while queued is never granted; the next caller gets the slot."""
    first = await admission.acquire(request("a"))
    leaver = await queued(admission, "leaver")
    stayer = await queued(admission, "stayer")
    leaver.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaver
    assert admission.queue_depth() == 1
    admission.release(first, None)
    await stayer
    assert [tenant for tenant, _ in observer.granted] == ["a", "stayer"]


async def test_admission_grant_racing_a_cancel_gives_the_slot_back(
    admission: SchedulerAdmission, observer: RecordingObserver
) -> None:
    """A caller cancelled right after its grant was decided returns the slot at once."""
    first = await admission.acquire(request("a"))
    racer = await queued(admission, "racer")

    def cancel_racer(tenant: str) -> None:
        if tenant == "racer":
            racer.cancel()

    observer.on_grant = cancel_racer
    admission.release(first, None)
    with pytest.raises(asyncio.CancelledError):
        await racer
    assert admission.core.in_flight("m") == 0
    third = await admission.acquire(request("c"))
    assert third.queue_wait_ms == 0


async def test_admission_queue_full_raises_with_retry_after(
    admission: SchedulerAdmission, observer: RecordingObserver
) -> None:
    """Past max depth, acquire raises QueueFull carrying the seed's fields and Retry-After."""
    await admission.acquire(request("a"))
    waiters = [await queued(admission, "b"), await queued(admission, "c")]
    with pytest.raises(QueueFull) as caught:
        await admission.acquire(request("d"))
    assert caught.value.extra["queueDepth"] == 2
    assert "Retry-After" in caught.value.headers
    assert observer.rejected == [("queue_full", "d")]
    for task in waiters:
        task.cancel()


async def test_admission_queue_timeout_raises(
    admission: SchedulerAdmission, clock: FakeClock
) -> None:
    """A waiter past the queue timeout is refused with QueueTimeout at the next event."""
    await admission.acquire(request("a"))
    late = await queued(admission, "late")
    clock.now += 31
    other = await queued(admission, "other")
    with pytest.raises(QueueTimeout):
        await late
    other.cancel()


async def test_admission_stop_refuses_waiters_and_later_callers(
    admission: SchedulerAdmission,
) -> None:
    """Stopping the scheduler refuses every waiting caller, and every later one, at once."""
    await admission.acquire(request("a"))
    waiter = await queued(admission, "b")
    await admission.stop()
    with pytest.raises(SchedulerStopped):
        await waiter
    with pytest.raises(SchedulerStopped):
        await admission.acquire(request("late"))


async def test_admission_release_rejects_foreign_grants(admission: SchedulerAdmission) -> None:
    """release() refuses a grant it did not hand out."""
    with pytest.raises(TypeError):
        admission.release(Grant(request("x")), None)


@dataclass
class FakePool:
    """`ModelEffects` of a pool that can answer a load inside `start_load` (re-entrantly)."""

    admission: SchedulerAdmission | None = None
    capacity_mb: int = 10_000
    resident: dict[str, int] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    answer_at_once: bool = False

    def start_load(self, model: str, policy: ModelPolicy) -> None:
        self.started.append(model)
        if self.answer_at_once and self.admission is not None:
            self.resident[model] = policy.mem_mb
            self.admission.model_ready(model, policy.concurrency, policy.mem_mb)

    def stop_model(self, model: str, sleep: bool, cut: QuorumError | None = None) -> None:
        self.stopped.append(model)
        if self.answer_at_once and self.admission is not None:
            self.resident.pop(model, None)
            self.admission.model_stopped(model)

    def free_memory_mb(self) -> int:
        return self.capacity_mb - sum(self.resident.values())

    def log_decision(self, text: str) -> None:
        self.decisions.append(text)


def managed(clock: FakeClock, pool: FakePool) -> SchedulerAdmission:
    config = SchedulerConfig(
        models={"auto": ModelPolicy(4000, concurrency=2, autoload=True)}, unlisted_ready=False
    )
    adm = SchedulerAdmission(config, clock=clock, tick_interval_s=3600, models=pool)
    pool.admission = adm
    return adm


async def test_admission_autoload_request_waits_for_the_load(clock: FakeClock) -> None:
    """A request for an autoload model waits while the pool loads it, then is granted."""
    pool = FakePool()
    adm = managed(clock, pool)
    await adm.start()
    waiter = asyncio.create_task(adm.acquire(AdmissionRequest("r", "auto", "t", "normal", 1, 1)))
    await asyncio.sleep(0)
    assert pool.started == ["auto"] and not waiter.done()
    assert adm.models()["auto"].state is ModelState.LOADING
    clock.now += 7.0
    adm.model_ready("auto", 2, 3900)
    grant = await waiter
    assert grant.queue_wait_ms == 7000
    assert adm.models()["auto"].mem_mb == 3900
    await adm.stop()


async def test_admission_pool_answering_inside_start_load_is_not_re_entered(
    clock: FakeClock,
) -> None:
    """A pool that reports ready from inside start_load is handled after the current event."""
    pool = FakePool(answer_at_once=True)
    adm = managed(clock, pool)
    await adm.start()
    adm.request_load("other", ModelPolicy(1000))
    assert state(adm.core, "other") == "ready"
    grant = await adm.acquire(AdmissionRequest("r", "auto", "t", "normal", 1, 1))
    assert grant.queue_wait_ms == 0 and pool.started == ["other", "auto"]
    adm.request_unload("other")
    assert state(adm.core, "other") == "absent" and pool.stopped == ["other"]
    await adm.stop()


async def test_admission_without_a_pool_refuses_managed_loads(clock: FakeClock) -> None:
    """With no pool attached a governed load is refused at once, and nothing is left pending."""
    adm = SchedulerAdmission(SchedulerConfig(unlisted_ready=False), clock=clock)
    notices: list[ModelNotice] = []
    adm.listen(notices.append)
    await adm.start()
    adm.request_load("x", ModelPolicy(1000))
    assert state(adm.core, "x") == "absent" and adm.core.table.wants == {}
    assert notices[-1].refused is not None and "does not fit" in notices[-1].refused
    await adm.stop()


async def test_a_release_during_another_event_is_handled_right_after_it(
    clock: FakeClock, observer: RecordingObserver
) -> None:
    """A grant given back while the scheduler handles a release (here by whoever hears of
    the waiter's grant) is handled right after that one, not inside it: its slot frees."""
    config = SchedulerConfig(default_concurrency=2, max_queue_depth=2)
    adm = SchedulerAdmission(config, clock=clock, tick_interval_s=3600, observer=observer)
    await adm.start()
    try:
        first = await adm.acquire(request("a"))
        other = await adm.acquire(request("c"))
        waiter = await queued(adm, "b")
        observer.on_grant = lambda tenant: adm.release(other, None) if tenant == "b" else None
        adm.release(first, None)  # grants b inside the release; b's grant releases c
        await waiter
        assert adm.core.slots.by_model["m"] == 1  # b alone
        assert adm.queue_depth() == 0
    finally:
        await adm.stop()
