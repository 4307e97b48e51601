"""Background tasks off the request path: one that does one thing on a timer (`Periodic`),
and how any is stopped (`cancelled`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("quorum.periodic")


class Periodic:
    """Runs `work` once on `start()` (so the first figures exist when the runner is ready),
    then every `interval_s` until `stop()`. A failing round is logged and the next one tried:
    whatever the last good round produced stays in place."""

    def __init__(self, name: str, interval_s: float, work: Callable[[], Awaitable[object]]):
        self.name = name
        self.interval_s = interval_s
        self.work = work
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.work()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            await cancelled(self._task)
            self._task = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.work()
            except Exception:
                log.exception("%s failed; keeping the last figures", self.name)


async def cancelled(task: asyncio.Task[None]) -> None:
    """Cancel `task` and wait until it ended."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
