"""The scheduler's only window onto the world.

The scheduler decides; whoever implements `Effects` acts. `loop.py` implements
the request half with asyncio futures and hands the model half to the model
pool (`ModelEffects`); tests and `bench/swap` implement both with recorders
and simulators. No method may call back into the scheduler: results come back
later as events (`ModelReady`, `LoadFailed`, `ModelStopped`, `ServeDone`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from runner.scheduler.config import ModelPolicy
from runner.scheduler.errors import SchedulerError
from runner.scheduler.events import Ticket


class RequestEffects(Protocol):
    def grant(self, ticket: Ticket, queue_wait_ms: int) -> bool:
        """Hand the caller its slot; return whether a live caller took it.

        `False` means the caller already left: the scheduler does not count the
        request in flight, and no `ServeDone` will follow for it.
        """
        ...

    def reject(self, ticket: Ticket, error: SchedulerError) -> None:
        """Refuse the caller with `error` (queue full, timeout, shutdown, model errors)."""
        ...


class ModelEffects(Protocol):
    """What the model pool does for the scheduler, and the one thing it measures for it."""

    def start_load(self, model: str, policy: ModelPolicy) -> None:
        """Begin loading `model`; answer later with `ModelReady` or `LoadFailed`.

        The scheduler reserves `policy.mem_mb` in its own accounting from this call
        until `ModelReady` (then the measured size) or `LoadFailed`.
        """
        ...

    def stop_models(self, models: Sequence[str]) -> None:
        """Stop these engines (drained, or past their drain timeout: cancel what is left).

        Answer each with `ModelStopped`.
        """
        ...

    def load_refused(self, model: str, reason: str) -> None:
        """A wanted load can never fit; a governed load task fails with `reason`."""
        ...

    def free_memory_mb(self) -> int:
        """Memory free for new loads now, as measured: device free minus other users' leases.

        Models still loading are NOT subtracted (the scheduler subtracts its own
        reservations); ready, draining and stopping ones are.
        """
        ...

    def log_decision(self, text: str) -> None:
        """One line per committed load, eviction or unload decision."""
        ...


class Effects(RequestEffects, ModelEffects, Protocol):
    """Everything the scheduler core calls."""
