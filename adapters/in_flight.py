"""The requests placed on one engine and not yet done: what a swap waits for.

When the pool starts an engine again beside the running one (`ModelPool.restart_engine`:
a LoRA adapter change on llama-server), it files the new engine, then waits for the old
one to be drained before stopping it. A request counts as placed from the first line of
the engine's `place`, before anything in it awaits: llama-server's `place` erases, saves
or restores a slot over HTTP first, and a request counted only after that looked idle
to the drain while it still had to be sent, so the old engine was stopped under it
(a 502 in CI on a busy machine; `tests/runner/engines/test_pool_swap.py`).
"""

from __future__ import annotations

import asyncio


class InFlight:
    """A count of placed requests with an event for "none": `enter` at the start of a
    placement, `leave` once per `enter` (its `done`, or a placement that failed)."""

    def __init__(self) -> None:
        self._count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        self._count += 1
        self._idle.clear()

    def leave(self) -> None:
        self._count = max(0, self._count - 1)
        if not self._count:
            self._idle.set()

    def __len__(self) -> int:
        return self._count

    async def drained(self, timeout_s: float) -> bool:
        """Wait until no placed request is still running; False past `timeout_s`."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True
