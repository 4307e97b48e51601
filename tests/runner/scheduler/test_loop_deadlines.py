"""Deadlines on a real event loop: a waiter leaves when its deadline comes, not at a tick."""

from __future__ import annotations

import asyncio
import time

import pytest

from runner.scheduler import SchedulerAdmission, SchedulerConfig
from runner.scheduler.errors import DeadlinePassed
from runner.scheduler.grants import AdmissionRequest

pytestmark = pytest.mark.timeout(10)


async def test_admission_waiter_leaves_when_its_deadline_comes() -> None:
    """With ticks an hour apart, a queued request with a 50 ms deadline is refused with 504
    once its deadline passes (its own timer), while the slot stays busy."""
    config = SchedulerConfig(default_concurrency=1, queue_timeout_s=None)
    adm = SchedulerAdmission(config, tick_interval_s=3600)
    await adm.start()
    try:
        held = await adm.acquire(AdmissionRequest("a", "m", "t", "normal", 1, 1))
        started = time.monotonic()
        with pytest.raises(DeadlinePassed):
            await adm.acquire(AdmissionRequest("b", "m", "t", "normal", 1, 1, deadline_ms=50))
        assert 0.05 <= time.monotonic() - started < 1.0
        assert adm.queue_depth() == 0
        adm.release(held, None)
        await asyncio.sleep(0)
    finally:
        await adm.stop()
