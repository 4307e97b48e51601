"""A recording `Effects` and small builders for driving the scheduler core directly."""

from __future__ import annotations

from dataclasses import dataclass, field

from runner.admission import AdmissionRequest, Usage
from runner.scheduler.config import SchedulerConfig
from runner.scheduler.core import Scheduler
from runner.scheduler.errors import SchedulerError
from runner.scheduler.events import RequestArrived, RequestCancelled, ServeDone, Tick, Ticket


@dataclass
class FakeEffects:
    """Records every grant and rejection; callers in `gone` refuse their grant."""

    granted: list[tuple[int, int]] = field(default_factory=list)  # (ticket id, wait ms)
    rejected: list[tuple[int, SchedulerError]] = field(default_factory=list)
    refused_grants: list[int] = field(default_factory=list)
    gone: set[int] = field(default_factory=set)

    def grant(self, ticket: Ticket, queue_wait_ms: int) -> bool:
        if ticket.ticket_id in self.gone:
            self.refused_grants.append(ticket.ticket_id)
            return False
        self.granted.append((ticket.ticket_id, queue_wait_ms))
        return True

    def reject(self, ticket: Ticket, error: SchedulerError) -> None:
        self.rejected.append((ticket.ticket_id, error))

    @property
    def granted_ids(self) -> list[int]:
        return [ticket_id for ticket_id, _ in self.granted]

    def rejection(self, ticket_id: int) -> SchedulerError:
        return next(err for tid, err in self.rejected if tid == ticket_id)


class Driver:
    """A scheduler, its fake effects and a fake clock the test moves by hand."""

    def __init__(self, config: SchedulerConfig, *, now: float = 0.0) -> None:
        self.now = now
        self.effects = FakeEffects()
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
