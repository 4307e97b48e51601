"""The messages the scheduler consumes, and the ticket it hands out.

Everything that happens to scheduling state is one of these frozen events,
handled one at a time by `Scheduler.handle` on the loop's single task. Each
event carries the time it happened (`at`, seconds on the injected clock); the
scheduler never reads a clock itself.

Seam for model lifecycle (ARCHITECTURE.md, "The scheduler"): a later issue adds
`LoadDone(model, error, at)` and `Unload(models, at)` here, handled by
`on_load_done` / `on_unload` in `core.py`, with `start_load` / `stop_models`
added to `Effects`. They are deliberately not built yet: today every model the
runner knows is treated as ready, with its configured concurrency.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from runner.admission import AdmissionRequest, Usage


class Band(IntEnum):
    """Priority band; a higher value is served first."""

    LOW = 0
    NORMAL = 1
    HIGH = 2

    @classmethod
    def parse(cls, priority: str) -> Band:
        """`"high" | "normal" | "low"` (the `X-Priority` values); anything else is normal."""
        return _BANDS.get(priority.strip().lower(), cls.NORMAL)

    @property
    def label(self) -> str:
        return self.name.lower()


_BANDS = {"high": Band.HIGH, "normal": Band.NORMAL, "low": Band.LOW}


@dataclass(frozen=True, slots=True)
class Ticket:
    """One request as the scheduler sees it.

    `ticket_id` is unique and increasing in arrival order (FIFO within a tenant
    follows it); `cost` is the estimated weighted service (input x1 + output x2).
    """

    ticket_id: int
    request: AdmissionRequest
    band: Band
    cost: int
    arrived_at: float

    @property
    def tenant(self) -> str:
        return self.request.tenant

    @property
    def model(self) -> str:
        return self.request.model


@dataclass(frozen=True, slots=True)
class RequestArrived:
    """A caller asks for a slot; it awaits a grant or a rejection."""

    ticket_id: int
    request: AdmissionRequest
    at: float


@dataclass(frozen=True, slots=True)
class RequestCancelled:
    """The caller went away; if still waiting, the request is withdrawn."""

    ticket_id: int
    at: float


@dataclass(frozen=True, slots=True)
class ServeDone:
    """A granted request finished at the engine; `usage` is what it reported, if known."""

    ticket_id: int
    usage: Usage | None
    at: float


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: expire waiters past the queue timeout, promote aged low ones."""

    at: float


@dataclass(frozen=True, slots=True)
class Shutdown:
    """The runner stops: every waiting request is refused."""

    at: float


Event = RequestArrived | RequestCancelled | ServeDone | Tick | Shutdown
