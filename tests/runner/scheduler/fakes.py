"""A recording `Effects` and small builders for driving the scheduler core directly."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from runner.admission import AdmissionRequest, Usage
from runner.scheduler.config import ModelPolicy, SchedulerConfig
from runner.scheduler.core import Scheduler
from runner.scheduler.errors import SchedulerError
from runner.scheduler.events import (
    LoadFailed,
    LoadRequested,
    ModelCrashed,
    ModelReady,
    ModelStopped,
    RequestArrived,
    RequestCancelled,
    ServeDone,
    Tick,
    Ticket,
    UnloadRequested,
)


@dataclass
class FakeEffects:
    """Records every call; callers in `gone` refuse their grant.

    Memory is a fake pool's: `capacity_mb` minus what `resident_mb` holds (models
    reported ready and not yet stopped), so loads in progress are not counted,
    as the `Effects` contract says.
    """

    granted: list[tuple[int, int]] = field(default_factory=list)  # (ticket id, wait ms)
    rejected: list[tuple[int, SchedulerError]] = field(default_factory=list)
    refused_grants: list[int] = field(default_factory=list)
    gone: set[int] = field(default_factory=set)
    started: list[str] = field(default_factory=list)
    stops: list[list[str]] = field(default_factory=list)
    refused_loads: list[tuple[str, str]] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    capacity_mb: int = 0
    resident_mb: dict[str, int] = field(default_factory=dict)

    def grant(self, ticket: Ticket, queue_wait_ms: int) -> bool:
        if ticket.ticket_id in self.gone:
            self.refused_grants.append(ticket.ticket_id)
            return False
        self.granted.append((ticket.ticket_id, queue_wait_ms))
        return True

    def reject(self, ticket: Ticket, error: SchedulerError) -> None:
        self.rejected.append((ticket.ticket_id, error))

    def start_load(self, model: str, policy: ModelPolicy) -> None:
        self.started.append(model)

    def stop_models(self, models: Sequence[str]) -> None:
        self.stops.append(list(models))

    def load_refused(self, model: str, reason: str) -> None:
        self.refused_loads.append((model, reason))

    def free_memory_mb(self) -> int:
        return self.capacity_mb - sum(self.resident_mb.values())

    def log_decision(self, text: str) -> None:
        self.decisions.append(text)

    @property
    def granted_ids(self) -> list[int]:
        return [ticket_id for ticket_id, _ in self.granted]

    @property
    def stopped(self) -> list[str]:
        """Every model `stop_models` named, in order."""
        return [model for call in self.stops for model in call]

    def rejection(self, ticket_id: int) -> SchedulerError:
        return next(err for tid, err in self.rejected if tid == ticket_id)


class Driver:
    """A scheduler, its fake effects and a fake clock the test moves by hand."""

    def __init__(self, config: SchedulerConfig, *, now: float = 0.0, capacity_mb: int = 0) -> None:
        self.now = now
        self.effects = FakeEffects(capacity_mb=capacity_mb)
        self.core = Scheduler(config, self.effects, started_at=now)
        self._next_id = 0

    def arrive(
        self,
        tenant: str = "t",
        *,
        priority: str = "normal",
        model: str = "m",
        tokens: tuple[int, int] = (10, 10),
    ) -> int:
        self._next_id += 1
        request = AdmissionRequest(
            request_id=f"r{self._next_id}",
            model=model,
            tenant=tenant,
            priority=priority,
            est_input_tokens=tokens[0],
            est_output_tokens=tokens[1],
        )
        self.core.on_request(RequestArrived(self._next_id, request, self.now))
        return self._next_id

    def done(self, ticket_id: int, usage: tuple[int, int] | None = None) -> None:
        real = Usage(*usage) if usage is not None else None
        self.core.on_serve_done(ServeDone(ticket_id, real, self.now))

    def cancel(self, ticket_id: int) -> None:
        self.core.on_cancel(RequestCancelled(ticket_id, self.now))

    def tick(self, advance_s: float = 0.0) -> None:
        self.now += advance_s
        self.core.on_tick(Tick(self.now))

    # -- model lifecycle, as the API and the pool would post it ---------------------

    def load(self, model: str, policy: ModelPolicy, evict_first: str | None = None) -> None:
        self.core.on_load_requested(LoadRequested(model, policy, evict_first, self.now))

    def ready(self, model: str, mem_mb: int, concurrency: int = 1) -> None:
        """The pool finished loading `model`: it now holds `mem_mb`."""
        self.effects.resident_mb[model] = mem_mb
        self.core.on_model_ready(ModelReady(model, concurrency, mem_mb, self.now))

    def failed(self, model: str, reason: str = "no such file") -> None:
        self.core.on_load_failed(LoadFailed(model, reason, self.now))

    def unload(self, model: str) -> None:
        self.core.on_unload_requested(UnloadRequested(model, self.now))

    def stopped(self, model: str) -> None:
        """The pool stopped `model`: its memory is free."""
        self.effects.resident_mb.pop(model, None)
        self.core.on_model_stopped(ModelStopped(model, self.now))

    def crashed(self, model: str, reason: str = "exit code 139") -> None:
        self.effects.resident_mb.pop(model, None)
        self.core.on_model_crashed(ModelCrashed(model, reason, self.now))
