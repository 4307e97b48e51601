"""A discrete-event replay of the deadline trace through the real scheduler core.

As `bench/fairness/sim.py`: the clock is simulated, each event is handed to
`runner.scheduler.core.Scheduler` with its time, and the engine is `SLOTS` slots that
each serve a request for its `service_s`. A `Variant` says how the runner is set up
and what it is told:

- `priorities`: interactive `high`, batch `low`; otherwise every request is `normal`;
- `fair`: VTC within a band (otherwise FCFS);
- `deadlines`: the requests carry `deadline_ms` (the runner refuses and drops by it);
- `give_up`: clients that hang up when their deadline passes (the runner withdraws them
  from the queue, as it does for any client gone); otherwise they stay connected until
  answered or refused (behind a gateway that keeps the connection, say).

Every arrival also times its own `handle` call: the wall time of the decision
(`perf_counter_ns`), and its CPU time (`thread_time_ns`: what the decision costs, without
the time a shared machine left it descheduled), for refusals on arrival. For every
request that waits, the forecast at arrival (`Scheduler.outlook.wait_s`, the figure a
deadline is checked against) is recorded beside the wait it got.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field

from bench.deadlines.trace import SLOTS, Arrival
from faults import QuorumError
from runner.scheduler.config import SchedulerConfig
from runner.scheduler.core import Scheduler
from runner.scheduler.events import Band, RequestArrived, RequestCancelled, ServeDone, Tick, Ticket
from runner.scheduler.grants import AdmissionRequest, Usage

MODEL = "sim"
TICK_S = 0.1  # as the runner's loop


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    priorities: bool
    fair: bool
    deadlines: bool
    give_up: bool = False


@dataclass(slots=True)
class Fate:
    """What became of one request."""

    arrival: Arrival
    granted_at: float | None = None
    done_at: float | None = None
    refused: str | None = None  # the error code
    decide_ns: int = 0  # wall time of its arrival's `handle`
    decide_cpu_ns: int = 0  # the same in this thread's CPU time (no time descheduled)
    forecast_s: float | None = None  # at arrival, when it had to wait

    @property
    def wait_s(self) -> float | None:
        return None if self.granted_at is None else self.granted_at - self.arrival.at

    @property
    def met(self) -> bool:
        """Served to the end, its first byte (the grant) within its deadline."""
        wait = self.wait_s
        deadline_s = self.arrival.kind.deadline_ms / 1000
        return self.done_at is not None and wait is not None and wait <= deadline_s


@dataclass
class Outcome:
    variant: Variant
    duration_s: float
    fates: list[Fate] = field(default_factory=list)


class _Engine:
    """`Effects` of the replay: a grant starts service on a simulated slot."""

    def __init__(self, replay: Replay) -> None:
        self._replay = replay

    def grant(self, ticket: Ticket, queue_wait_ms: int) -> bool:
        return self._replay.granted(ticket)

    def reject(self, ticket: Ticket, error: QuorumError) -> None:
        self._replay.fates[ticket.ticket_id].refused = error.code


class Replay:
    def __init__(self, variant: Variant, config: SchedulerConfig, duration_s: float) -> None:
        self.variant = variant
        self.config = SchedulerConfig(
            max_queue_depth=config.max_queue_depth,
            queue_timeout_s=config.queue_timeout_s,
            model_concurrency={MODEL: SLOTS},
            low_aging_s=config.low_aging_s,
            fair=variant.fair,
        )
        self.core = Scheduler(self.config, _Engine(self))
        self.duration_s = duration_s
        self.fates: dict[int, Fate] = {}
        self.now = 0.0
        self._heap: list[tuple[float, int, str, int]] = []
        self._seq = 0

    def _push(self, at: float, what: str, ticket_id: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, what, ticket_id))

    def granted(self, ticket: Ticket) -> bool:
        fate = self.fates[ticket.ticket_id]
        if fate.refused is not None:  # the client hung up
            return False
        fate.granted_at = self.now
        self._push(self.now + fate.arrival.service_s, "done", ticket.ticket_id)
        return True

    def run(self, arrivals: list[Arrival]) -> Outcome:
        for ticket_id, arrival in enumerate(arrivals, start=1):
            self.fates[ticket_id] = Fate(arrival)
            self._push(arrival.at, "arrive", ticket_id)
        ticks = int(self.duration_s / TICK_S)
        for i in range(1, ticks + 1):
            self._push(i * TICK_S, "tick")
        while self._heap:
            at, _, what, ticket_id = heapq.heappop(self._heap)
            if at > self.duration_s:
                break
            self.now = at
            if what == "arrive":
                self._arrive(ticket_id)
            elif what == "done":
                fate = self.fates[ticket_id]
                fate.done_at = at
                arrival = fate.arrival
                usage = Usage(arrival.input_tokens, arrival.output_tokens)
                self.core.handle(ServeDone(ticket_id, usage, at))
            elif what == "give_up":
                if self.core.is_waiting(ticket_id):
                    self.fates[ticket_id].refused = "client_gone"
                    self.core.handle(RequestCancelled(ticket_id, at))
            else:
                self.core.handle(Tick(at))
        return Outcome(self.variant, self.duration_s, list(self.fates.values()))

    def _arrive(self, ticket_id: int) -> None:
        fate = self.fates[ticket_id]
        arrival, variant = fate.arrival, self.variant
        priority = arrival.kind.priority if variant.priorities else "normal"
        deadline = arrival.kind.deadline_ms if variant.deadlines else None
        request = AdmissionRequest(  # output estimated as the client's max_tokens
            f"r{ticket_id}",
            MODEL,
            arrival.tenant,
            priority,
            arrival.input_tokens,
            arrival.kind.tokens_out[1],
            deadline,
        )
        forecast = self.core.outlook.wait_s(MODEL, Band.parse(priority), arrival.tenant, self.now)
        cpu, started = time.thread_time_ns(), time.perf_counter_ns()
        self.core.handle(RequestArrived(ticket_id, request, self.now))
        fate.decide_ns = time.perf_counter_ns() - started
        fate.decide_cpu_ns = time.thread_time_ns() - cpu
        if self.core.is_waiting(ticket_id):
            fate.forecast_s = forecast
            deadline_at = self.now + arrival.kind.deadline_ms / 1000
            if deadline is not None:
                self._push(deadline_at, "tick")  # the loop's own timer for it
            if variant.give_up:
                self._push(deadline_at, "give_up", ticket_id)
