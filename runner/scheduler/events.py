"""The messages the scheduler consumes, and the ticket it hands out.

Everything that happens to scheduling state is one of these frozen events,
handled one at a time by `Scheduler.handle` on the loop's single task. Each
event carries the time it happened (`at`, seconds on the injected clock); the
scheduler never reads a clock itself.

Requests: `RequestArrived`, `RequestCancelled`, `ServeDone`. Time: `Tick`.
Model lifecycle, from the API and the model pool: `LoadRequested`,
`LoadCancellation`, `UnloadRequested` (asked for), `ModelReady`, `LoadFailure`, `ModelStopped`,
`ModelSlept`, `ModelCrashed` (reported by the pool, which acts on
`Effects.start_load` and `Effects.stop_model`). `RunnerStopping` ends it all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum

from faults.record import record
from runner.scheduler.config import ModelPolicy
from runner.scheduler.grants import AdmissionRequest, Usage
from tenants.fairness import service_cost


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
        return _LABELS[self]  # not `self.name.lower()`: read on every grant (metrics)


_BANDS = {"high": Band.HIGH, "normal": Band.NORMAL, "low": Band.LOW}
_LABELS = {band: label for label, band in _BANDS.items()}


@record
class Ticket:
    """One request as the scheduler sees it.

    `ticket_id` is unique and increasing in arrival order (FIFO within a tenant
    follows it); `cost` is the estimated weighted service (input x1 + output x2).
    `tenant` and `model` are the request's, copied once: the scheduler reads them a dozen
    times per request, and a field costs less to read than a property.
    """

    ticket_id: int
    request: AdmissionRequest
    band: Band
    cost: int
    arrived_at: float
    tenant: str = field(init=False, repr=False, compare=False)
    model: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tenant", self.request.tenant)
        object.__setattr__(self, "model", self.request.model)

    @classmethod
    def of(cls, ticket_id: int, request: AdmissionRequest, now: float) -> Ticket:
        """The ticket of a request arriving `now`: its band, and its cost estimated."""
        cost = service_cost(request.est_input_tokens, request.est_output_tokens)
        return cls(ticket_id, request, Band.parse(request.priority), cost, arrived_at=now)

    @property
    def deadline_at(self) -> float | None:
        """When its client stops waiting (`deadline_ms` after arrival); `None`: never."""
        ms = self.request.deadline_ms
        return None if ms is None else self.arrived_at + ms / 1000


@record
class RequestArrived:
    """A caller asks for a slot; it awaits a grant or a rejection."""

    ticket_id: int
    request: AdmissionRequest
    at: float


@record
class RequestCancelled:
    """The caller went away; if still waiting, the request is withdrawn."""

    ticket_id: int
    at: float


@record
class ServeDone:
    """A granted request finished at the engine; `usage` is what it reported, if known."""

    ticket_id: int
    usage: Usage | None
    at: float


@dataclass(frozen=True, slots=True)
class TenantsChanged:
    """Tenant policies changed (a governed policy change, SIGHUP): the tenants' weights,
    queue caps and in-flight caps from now on. Requests in flight keep going."""

    tenant_weights: Mapping[str, float]
    default_weight: float
    tenant_queue_caps: Mapping[str, int]
    default_tenant_queue_cap: int | None
    tenant_in_flight_caps: Mapping[str, int]
    default_in_flight_cap: int | None
    at: float


@dataclass(frozen=True, slots=True)
class PermitGranted:
    """A permit of `tenant`'s cross-replica in-flight cap is now held for this replica
    (asked for with `PermitEffects.want_permit`)."""

    tenant: str
    at: float


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: expire waiters past the queue timeout, promote aged low ones."""

    at: float


@dataclass(frozen=True, slots=True)
class RunnerStopping:
    """The runner stops: every waiting request is refused."""

    at: float


@dataclass(frozen=True, slots=True)
class LoadRequested:
    """A model is wanted: a governed load (API), or a request for an `autoload` model.

    `evict_first` names the model to evict first if room must be made (`evictModel`).
    """

    model: str
    policy: ModelPolicy
    evict_first: str | None
    at: float


@dataclass(frozen=True, slots=True)
class LoadCancellation:
    """A governed load is called off: forget the want, or stop the start in progress."""

    model: str
    at: float


@dataclass(frozen=True, slots=True)
class ModelReady:
    """The pool finished loading `model`: `mem_mb` is measured, `concurrency` its slots."""

    model: str
    concurrency: int
    mem_mb: int
    at: float


@dataclass(frozen=True, slots=True)
class LoadFailure:
    """The pool could not load `model` (start, health); `reason` says why in words fit
    for any tenant (never engine log lines), `exit_code` the engine's if it exited.
    `cancelled`: the load was called off (it ends absent, not failed)."""

    model: str
    reason: str
    at: float
    exit_code: int | None = None
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class UnloadRequested:
    """Stop admitting requests for `model`, drain the ones in flight, then stop it
    (`sleep`: put it to sleep instead, vLLM's warm standby)."""

    model: str
    at: float
    sleep: bool = False


@dataclass(frozen=True, slots=True)
class ModelStopped:
    """The pool stopped `model`'s engine (asked to, or it exited): its memory is free;
    `freed_mb` is what the pool measured it held."""

    model: str
    at: float
    freed_mb: int = 0


@dataclass(frozen=True, slots=True)
class ModelSlept:
    """The pool put `model`'s engine to sleep: it still holds `mem_mb`; `freed_mb` left."""

    model: str
    mem_mb: int
    freed_mb: int
    at: float


@dataclass(frozen=True, slots=True)
class ModelCrashed:
    """`model`'s engine died unasked (`reason` in words fit for any tenant, `exit_code`
    negative for a signal); the scheduler decides whether it is started again."""

    model: str
    reason: str
    at: float
    exit_code: int | None = None


ModelEvent = (
    LoadRequested
    | LoadCancellation
    | ModelReady
    | LoadFailure
    | UnloadRequested
    | ModelStopped
    | ModelSlept
    | ModelCrashed
)
Event = (
    RequestArrived
    | RequestCancelled
    | ServeDone
    | Tick
    | RunnerStopping
    | TenantsChanged
    | PermitGranted
    | ModelEvent
)
