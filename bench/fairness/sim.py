"""A discrete-event replay of a workload through the real scheduler core.

The clock is simulated: events are processed in time order and each one is
handed to `runner.scheduler.core.Scheduler` with its simulated time. The
engine is simulated too: `slots` requests run at once and each slot processes
`capacity / slots` weighted tokens per second (input x1 + output x2), so a
saturated engine delivers exactly `capacity` weighted tokens per second. No
request ever disconnects; rejections and timeouts are recorded.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field

from bench.fairness.workloads import Arrival
from runner.scheduler.config import SchedulerConfig
from runner.scheduler.core import Scheduler
from runner.scheduler.errors import SchedulerError
from runner.scheduler.events import RequestArrived, ServeDone, Tick, Ticket
from runner.scheduler.grants import AdmissionRequest, Usage
from tenants.fairness import service_cost

MODEL = "sim"


@dataclass(slots=True)
class Served:
    tenant: str
    cost: int
    start: float
    end: float


@dataclass
class Outcome:
    """What happened in one replay."""

    duration_s: float
    capacity: float
    served: list[Served] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)
    reject_ns: list[int] = field(default_factory=list)
    retry_after: list[int] = field(default_factory=list)
    # (time, frozenset of tenants with waiting requests) after every event
    backlog: list[tuple[float, frozenset[str]]] = field(default_factory=list)


class _Engine:
    """`Effects` for the replay: a grant starts service on a simulated slot."""

    def __init__(self, sim: Replay) -> None:
        self._sim = sim

    def grant(self, ticket: Ticket, queue_wait_ms: int) -> bool:
        self._sim.start(ticket)
        return True

    def reject(self, ticket: Ticket, error: SchedulerError) -> None:
        self._sim.refused(ticket, error)


class Replay:
    def __init__(
        self,
        config: SchedulerConfig,
        *,
        slots: int,
        capacity: float,
        duration_s: float,
        estimate_output: int | None = None,
    ) -> None:
        self.config = SchedulerConfig(
            max_queue_depth=config.max_queue_depth,
            queue_timeout_s=config.queue_timeout_s,
            model_concurrency={MODEL: slots},
            tenant_weights=config.tenant_weights,
            tenant_queue_caps=config.tenant_queue_caps,
            low_aging_s=config.low_aging_s,
            fair=config.fair,
        )
        self.core = Scheduler(self.config, _Engine(self))
        self.slot_rate = capacity / slots
        self.duration_s = duration_s
        self.estimate_output = estimate_output
        self.outcome = Outcome(duration_s, capacity)
        self.now = 0.0
        self._heap: list[tuple[float, int, object]] = []
        self._seq = 0
        self._real: dict[int, Arrival] = {}

    def _push(self, at: float, item: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, item))

    def start(self, ticket: Ticket) -> None:
        real = self._real[ticket.ticket_id]
        cost = service_cost(real.input_tokens, real.output_tokens)
        end = self.now + cost / self.slot_rate
        self.outcome.served.append(Served(ticket.tenant, cost, self.now, end))
        self._push(end, ticket.ticket_id)

    def refused(self, ticket: Ticket, error: SchedulerError) -> None:
        del self._real[ticket.ticket_id]
        rejected = self.outcome.rejected
        rejected[error.code] = rejected.get(error.code, 0) + 1
        self.outcome.retry_after.append(int(error.headers.get("Retry-After", "0")))

    def run(self, arrivals: list[Arrival], tick_s: float = 1.0) -> Outcome:
        for i, arrival in enumerate(arrivals, start=1):
            self._push(arrival.at, (i, arrival))
        t = tick_s
        while t < self.duration_s:
            self._push(t, None)
            t += tick_s
        while self._heap:
            at, _, item = heapq.heappop(self._heap)
            if at > self.duration_s:
                break
            self.now = at
            if item is None:
                self.core.handle(Tick(at))
            elif isinstance(item, int):
                real = self._real.pop(item)
                self.core.handle(ServeDone(item, Usage(real.input_tokens, real.output_tokens), at))
            else:
                assert isinstance(item, tuple)
                self._arrive(*item)
            self.outcome.backlog.append((at, frozenset(self.core.waiting_tenants())))
        return self.outcome

    def _arrive(self, ticket_id: int, arrival: Arrival) -> None:
        est_out = self.estimate_output or arrival.output_tokens
        request = AdmissionRequest(
            f"r{ticket_id}", MODEL, arrival.tenant, arrival.priority, arrival.input_tokens, est_out
        )
        self._real[ticket_id] = arrival
        started = time.perf_counter_ns()
        self.core.handle(RequestArrived(ticket_id, request, self.now))
        elapsed = time.perf_counter_ns() - started
        if ticket_id not in self._real:  # refused on arrival
            self.outcome.reject_ns.append(elapsed)
