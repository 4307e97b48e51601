"""A slot is the engine's until the engine let the request go: a cancel the engine acts on
later (ComfyUI's running node, the speech worker's segment) keeps the slot taken, so the
next request waits in the runner and its queue wait says so (runner/scheduler/grants.py).
Driven by events and futures the test resolves; the clock is a fake one."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from runner.scheduler import SchedulerAdmission, SchedulerConfig
from runner.scheduler.events import RequestCancelled
from runner.scheduler.grants import Grant, Hold
from tests.runner.scheduler.fakes import Driver
from tests.runner.scheduler.test_loop import FakeClock, request


def test_core_slot_of_a_cancelled_request_is_held_until_its_serve_done() -> None:
    """The core frees a slot only on ServeDone: a withdrawal of a request in flight (its
    client left) frees nothing, the next waits, and its wait counts until the engine let go."""
    d = Driver(SchedulerConfig(default_concurrency=1))
    first = d.arrive("a")
    second = d.arrive("b")
    d.now += 0.5
    d.core.handle(RequestCancelled(first, d.now))  # the client of `first` is gone
    assert d.core.is_waiting(second) and d.core.in_flight("m") == 1
    assert d.core.stats(d.now).capabilities()["running"] == 1
    d.now += 2.0  # the engine finishes its node, then lets the prompt go
    d.done(first)
    assert d.effects.granted == [(first, 0), (second, 2500)]
    assert d.core.stats(d.now).capabilities()["running"] == 1


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def admission(clock: FakeClock) -> AsyncIterator[SchedulerAdmission]:
    config = SchedulerConfig(default_concurrency=1, max_queue_depth=4, queue_timeout_s=None)
    adm = SchedulerAdmission(config, clock=clock, tick_interval_s=3600)
    await adm.start()
    yield adm
    await adm.stop()


async def _settle() -> None:
    for _ in range(3):  # let done callbacks and posted events run
        await asyncio.sleep(0)


async def test_hold_keeps_the_slot_until_the_engine_let_go(
    admission: SchedulerAdmission, clock: FakeClock
) -> None:
    """A job's scope cancelled while its engine goes on (`release_when`): the scope ends at
    once, the slot stays taken until the engine's let-go completes, then the next waiter
    gets it with the whole wait in its `queue_wait_ms`."""
    let_go: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    inside = asyncio.Event()

    async def job() -> None:
        async with Hold(admission, request("a")) as held:
            held.release_when(let_go)
            inside.set()
            await asyncio.Event().wait()  # the work, until the job is deleted

    running = asyncio.create_task(job())
    await inside.wait()
    second = asyncio.create_task(admission.acquire(request("b")))
    await _settle()
    running.cancel()  # DELETE /v1/jobs/{id}
    with pytest.raises(asyncio.CancelledError):
        await running
    clock.now += 3.0
    await _settle()
    assert not second.done() and admission.queue_depth() == 1
    assert admission.stats().capabilities()["running"] == 1
    let_go.set_result(None)
    grant: Grant = await asyncio.wait_for(second, 5)
    assert grant.queue_wait_ms == 3000
    admission.release(grant, None)


async def test_hold_without_let_go_releases_at_the_end_of_the_scope(
    admission: SchedulerAdmission,
) -> None:
    """Work that never calls `release_when` gives the slot back when its scope ends, as
    before (engines whose cancel stops the work at once)."""
    async with Hold(admission, request("a")):
        assert admission.stats().capabilities()["running"] == 1
    assert admission.stats().capabilities()["running"] == 0


async def test_failed_let_go_still_releases_and_logs(
    admission: SchedulerAdmission, caplog: pytest.LogCaptureFixture
) -> None:
    """A let-go that fails (ComfyUI unreachable while asked) releases the slot anyway and
    says why in the log; a slot is never kept forever."""
    let_go: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    async with Hold(admission, request("a")) as held:
        held.release_when(let_go)
    assert admission.stats().capabilities()["running"] == 1
    with caplog.at_level(logging.WARNING, logger="quorum.scheduler"):
        let_go.set_exception(ConnectionError("refused"))
        await _settle()
    assert admission.stats().capabilities()["running"] == 0
    assert "refused" in caplog.text
