"""The scheduler's only window onto the world.

The scheduler decides; whoever implements `Effects` acts. `loop.py` implements
it with asyncio futures; tests implement it with a recorder.
"""

from __future__ import annotations

from typing import Protocol

from runner.scheduler.errors import SchedulerError
from runner.scheduler.events import Ticket


class Effects(Protocol):
    def grant(self, ticket: Ticket, queue_wait_ms: int) -> bool:
        """Hand the caller its slot; return whether a live caller took it.

        `False` means the caller already left: the scheduler does not count the
        request in flight, and no `ServeDone` will follow for it.
        """
        ...

    def reject(self, ticket: Ticket, error: SchedulerError) -> None:
        """Refuse the caller with `error` (queue full, timeout, shutdown)."""
        ...
