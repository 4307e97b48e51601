"""`SchedulerAdmission`: the core behind the Admission seam, on a real event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from runner.admission import AdmissionRequest, Grant, Usage
from runner.scheduler import (
    QueueFull,
    QueueTimeout,
    SchedulerAdmission,
    SchedulerConfig,
    SchedulerStopped,
)


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
    await asyncio.sleep(0)  # let acquire post its event
    await admission.idle()
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
    assert admission.stats().capabilities() == {
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
    await admission.idle()
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
    await admission.idle()
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
