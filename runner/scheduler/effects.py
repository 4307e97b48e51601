"""The scheduler's only window onto the world.

The scheduler decides; whoever implements `Effects` acts. `admission.py` implements
the request half with asyncio futures, hands the model half to the model pool
(`ModelEffects`) and passes `notify` on to whoever listens (load tasks, unloads,
metrics); tests and `bench/` implement all of it with recorders and simulators.
No method may call back into the scheduler: results come back later as events
(`ModelReady`, `LoadFailure`, `ModelStopped`, `ModelSlept`, `ServeDone`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from faults import QuorumError
from runner.scheduler.config import ModelPolicy
from runner.scheduler.events import Ticket
from runner.scheduler.models import ModelView


class RequestEffects(Protocol):
    def grant(self, ticket: Ticket, queue_wait_ms: int) -> bool:
        """Hand the caller its slot; return whether a live caller took it.

        `False` means the caller already left: the scheduler does not count the
        request in flight, and no `ServeDone` will follow for it.
        """
        ...

    def reject(self, ticket: Ticket, error: QuorumError) -> None:
        """Refuse the caller with `error` (queue full, timeout, shutdown, model errors)."""
        ...


class ModelEffects(Protocol):
    """What the model pool does for the scheduler, and the one thing it measures for it."""

    def start_load(self, model: str, policy: ModelPolicy) -> None:
        """Begin loading `model` (or waking it up); answer later with `ModelReady` or
        `LoadFailure`. The scheduler reserves `policy.mem_mb` in its own accounting from
        this call until `ModelReady` (then the measured size) or `LoadFailure`.
        """
        ...

    def stop_model(self, model: str, sleep: bool, cut: QuorumError | None = None) -> None:
        """Stop this engine (drained, or past its drain timeout: cancel what is left), or
        put it to sleep; answer with `ModelStopped` or `ModelSlept`.

        `cut`: requests are still in flight on it (its drain timeout passed); they are
        answered this, not the connection loss the stop causes them."""
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


@dataclass(frozen=True, slots=True)
class ModelNotice:
    """What the scheduler tells listeners about one model, each time it changes.

    `view` is the model now; `refused` says why a wanted load can never happen (it
    does not fit, the runner stops); `freed_mb` what a stop or a sleep freed.
    """

    view: ModelView
    refused: str | None = None
    freed_mb: int | None = None


class NoticeEffects(Protocol):
    def notify(self, notice: ModelNotice) -> None:
        """A model changed state (or a load was refused): tell whoever listens."""
        ...


class PermitEffects(Protocol):
    """Cross-replica in-flight caps (`SchedulerConfig.shared_in_flight`): the scheduler asks
    for a permit of a capped tenant's cap, and gives each back when its request ends;
    whoever implements this holds them in a store every replica shares and answers a
    granted one with `PermitGranted`."""

    def want_permit(self, tenant: str) -> None:
        """Get one more permit of `tenant`'s cap for this replica (answer: PermitGranted)."""
        ...

    def release_permit(self, tenant: str) -> None:
        """Give one permit of `tenant`'s cap back."""
        ...


class Effects(RequestEffects, ModelEffects, NoticeEffects, Protocol):
    """Everything the scheduler core calls."""
