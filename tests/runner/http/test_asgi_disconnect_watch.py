"""`runner/http/asgi.DisconnectWatch` serving two phases of one request (its token budget
wait, then its admission): started again after a disarm, it watches again, and a client
that left in between is not missed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from runner.http.asgi import GONE_HOOK, DisconnectWatch

pytestmark = pytest.mark.timeout(30)


async def test_disconnect_watch_restarted_hears_a_disconnect_from_the_gap() -> None:
    """Without the runner's hook: `receive` is read by one task only; a disconnect that
    came while the watch was disarmed cancels the handler once it is started again."""
    gone = asyncio.Event()
    reads = 0

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        await gone.wait()
        return {"type": "http.disconnect"}

    async def handler() -> None:
        watch = DisconnectWatch(task)
        watch.start({}, receive)
        watch.disarm()
        gone.set()
        while reads == 0 or not watch._heard:  # the watch's task has read the disconnect
            await asyncio.sleep(0)
        assert not watch.gone  # disarmed: nothing cancelled
        watch.start({}, receive)
        await asyncio.Event().wait()  # cancelled here

    task = asyncio.ensure_future(handler())
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(10):
            await task
    assert reads == 1


async def test_disconnect_watch_restarted_registers_with_the_hook_again() -> None:
    """With the runner's hook: disarming unregisters; starting again registers anew."""
    registered: list[Callable[[], None] | None] = []
    task = asyncio.ensure_future(asyncio.Event().wait())
    watch = DisconnectWatch(task)
    scope = {GONE_HOOK: registered.append}
    watch.start(scope, _never)
    watch.disarm()
    watch.start(scope, _never)
    assert registered == [watch.fire, None, watch.fire]
    callback = registered[-1]
    assert callback is not None
    callback()
    assert watch.gone
    with pytest.raises(asyncio.CancelledError):
        await task


async def _never() -> dict[str, Any]:
    await asyncio.Event().wait()
    return {}
