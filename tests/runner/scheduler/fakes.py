"""A recording `Effects` and small builders for driving the scheduler core directly."""

from __future__ import annotations

from dataclasses import dataclass, field

from faults import QuorumError
from runner.scheduler.config import ModelPolicy, SchedulerConfig
from runner.scheduler.core import Scheduler
from runner.scheduler.effects import ModelNotice
from runner.scheduler.events import (
    LoadCancellation,
    LoadFailure,
    LoadRequested,
    ModelCrashed,
    ModelReady,
    ModelSlept,
    ModelStopped,
    RequestArrived,
    RequestCancelled,
    ServeDone,
    Tick,
    Ticket,
    UnloadRequested,
)
from runner.scheduler.grants import AdmissionRequest, Usage
from runner.scheduler.models import ModelState, ModelView


@dataclass
class FakeEffects:
    """Records every call; callers in `gone` refuse their grant.

    Memory is a fake pool's: `capacity_mb` minus what `resident_mb` holds (models
    reported ready and not yet stopped), so loads in progress are not counted,
    as the `Effects` contract says.
    """

    granted: list[tuple[int, int]] = field(default_factory=list)  # (ticket id, wait ms)
    rejected: list[tuple[int, QuorumError]] = field(default_factory=list)
    refused_grants: list[int] = field(default_factory=list)
    gone: set[int] = field(default_factory=set)
    started: list[str] = field(default_factory=list)
    stops: list[list[str]] = field(default_factory=list)  # one model a call
    slept: list[str] = field(default_factory=list)
    cuts: dict[str, QuorumError] = field(default_factory=dict)  # stop_model's `cut`, by model
    refused_loads: list[tuple[str, str]] = field(default_factory=list)
    notices: list[ModelNotice] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    capacity_mb: int = 0
    resident_mb: dict[str, int] = field(default_factory=dict)

    def grant(self, ticket: Ticket, queue_wait_ms: int) -> bool:
        if ticket.ticket_id in self.gone:
            self.refused_grants.append(ticket.ticket_id)
            return False
        self.granted.append((ticket.ticket_id, queue_wait_ms))
        return True

    def reject(self, ticket: Ticket, error: QuorumError) -> None:
        self.rejected.append((ticket.ticket_id, error))

    def start_load(self, model: str, policy: ModelPolicy) -> None:
        self.started.append(model)

    def stop_model(self, model: str, sleep: bool, cut: QuorumError | None = None) -> None:
        self.stops.append([model])
        if sleep:
            self.slept.append(model)
        if cut is not None:
            self.cuts[model] = cut

    def notify(self, notice: ModelNotice) -> None:
        self.notices.append(notice)
        if notice.refused is not None:
            self.refused_loads.append((notice.view.model, notice.refused))

    def free_memory_mb(self) -> int:
        return self.capacity_mb - sum(self.resident_mb.values())

    def log_decision(self, text: str) -> None:
        self.decisions.append(text)

    @property
    def granted_ids(self) -> list[int]:
        return [ticket_id for ticket_id, _ in self.granted]

    @property
    def stopped(self) -> list[str]:
        """Every model `stop_model` named, in order."""
        return [model for call in self.stops for model in call]

    def rejection(self, ticket_id: int) -> QuorumError:
        return next(err for tid, err in self.rejected if tid == ticket_id)


def state(core: Scheduler, model: str) -> str:
    """`model`'s state as the runner reads it (`Scheduler.models`); `absent` when unknown."""
    view = core.models().get(model)
    return view.state.value if view is not None else ModelState.ABSENT.value


class Driver:
    """A scheduler, its fake effects and a fake clock the test moves by hand."""

    def __init__(self, config: SchedulerConfig, *, now: float = 0.0, capacity_mb: int = 0) -> None:
        self.now = now
        self.effects = FakeEffects(capacity_mb=capacity_mb)
        self.core = Scheduler(config, self.effects)
        self._next_id = 0

    def state(self, model: str) -> str:
        return state(self.core, model)

    def resident(self) -> dict[str, ModelView]:
        """The models holding memory (loading, ready, draining, stopping, asleep)."""
        return {m: v for m, v in self.core.models().items() if v.state.holds_memory}

    def victims(self) -> dict[str, tuple[str, ...]]:
        """The loads waiting for memory, with the victims chosen for each."""
        return {model: want.victims for model, want in self.core.table.wants.items()}

    def arrive(
        self,
        tenant: str = "t",
        *,
        priority: str = "normal",
        model: str = "m",
        tokens: tuple[int, int] = (10, 10),
        deadline_ms: int | None = None,
    ) -> int:
        self._next_id += 1
        request = AdmissionRequest(
            request_id=f"r{self._next_id}",
            model=model,
            tenant=tenant,
            priority=priority,
            est_input_tokens=tokens[0],
            est_output_tokens=tokens[1],
            deadline_ms=deadline_ms,
        )
        self.core.handle(RequestArrived(self._next_id, request, self.now))
        return self._next_id

    def done(self, ticket_id: int, usage: tuple[int, int] | None = None) -> None:
        real = Usage(*usage) if usage is not None else None
        self.core.handle(ServeDone(ticket_id, real, self.now))

    def cancel(self, ticket_id: int) -> None:
        self.core.handle(RequestCancelled(ticket_id, self.now))

    def tick(self, advance_s: float = 0.0) -> None:
        self.now += advance_s
        self.core.handle(Tick(self.now))

    # -- model lifecycle, as the API and the pool would post it ---------------------

    def load(self, model: str, policy: ModelPolicy, evict_first: str | None = None) -> None:
        self.core.handle(LoadRequested(model, policy, evict_first, self.now))

    def cancel_load(self, model: str) -> None:
        self.core.handle(LoadCancellation(model, self.now))

    def ready(self, model: str, mem_mb: int, concurrency: int = 1) -> None:
        """The pool finished loading `model`: it now holds `mem_mb`."""
        self.effects.resident_mb[model] = mem_mb
        self.core.handle(ModelReady(model, concurrency, mem_mb, self.now))

    def failed(
        self, model: str, reason: str = "no such file", exit_code: int | None = None
    ) -> None:
        self.core.handle(LoadFailure(model, reason, self.now, exit_code))

    def unload(self, model: str, sleep: bool = False) -> None:
        self.core.handle(UnloadRequested(model, self.now, sleep))

    def stopped(self, model: str, freed_mb: int = 0) -> None:
        """The pool stopped `model`: its memory is free."""
        self.effects.resident_mb.pop(model, None)
        self.core.handle(ModelStopped(model, self.now, freed_mb))

    def slept(self, model: str, mem_mb: int) -> None:
        """The pool put `model` to sleep: it holds `mem_mb` still."""
        self.effects.resident_mb[model] = mem_mb
        self.core.handle(ModelSlept(model, mem_mb, 0, self.now))

    def crashed(self, model: str, reason: str = "exit code 139", exit_code: int = 139) -> None:
        self.effects.resident_mb.pop(model, None)
        self.core.handle(ModelCrashed(model, reason, self.now, exit_code))
