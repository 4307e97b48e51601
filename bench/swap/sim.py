"""The simulated machine, and the real scheduler driven on it.

`Machine` is a discrete-event simulation of one GPU server: a clock that jumps
from event to event, memory (`capacity_mb` minus the models loaded and not yet
stopped), one loader (loads run one after another, each taking
`start_s + mem_mb / bandwidth`), stops that take `stop_s`, and requests served
for their trace service time. A `Policy` decides; the machine only does what
it is told and reports back.

`Ours` is the runner's policy: the real `runner.scheduler.core.Scheduler` with
its eviction policy, fed the machine's events with their simulated times; its
`Effects` are the machine (grant = start serving, start_load = queue a load,
stop_model = stop, free_memory_mb = capacity minus what is loaded).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.swap.trace import Request, Trace
from faults import QuorumError
from runner.scheduler.config import ModelPolicy, SchedulerConfig
from runner.scheduler.core import Scheduler
from runner.scheduler.effects import ModelNotice
from runner.scheduler.events import (
    ModelReady,
    ModelStopped,
    RequestArrived,
    ServeDone,
    Tick,
    Ticket,
)
from runner.scheduler.grants import AdmissionRequest

TICK_S = 0.25


@dataclass
class Outcome:
    """What one policy did with the trace."""

    policy: str
    loads: list[tuple[str, float, float]] = field(default_factory=list)  # model, start, end
    granted: dict[int, float] = field(default_factory=dict)  # rid -> grant time
    order: list[str] = field(default_factory=list)  # models in grant order
    finished: dict[int, float] = field(default_factory=dict)
    rejected: dict[int, str] = field(default_factory=dict)
    decisions: int = 0

    def load_seconds(self) -> float:
        return sum(end - start for _, start, end in self.loads)

    def waits(self, requests: Sequence[Request], band: str | None = None) -> list[float]:
        return sorted(
            self.granted[r.rid] - r.at
            for r in requests
            if r.rid in self.granted and (band is None or r.band == band)
        )

    def summary(self, requests: Sequence[Request]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "policy": self.policy,
            "loads": len(self.loads),
            "cold_load_s": round(self.load_seconds(), 1),
            "served": len(self.granted),
            "rejected": len(self.rejected),
            "makespan_s": round(max(self.finished.values(), default=0.0), 1),
            "decisions_logged": self.decisions,
        }
        for band in ("high", "normal", "low", None):
            waits = self.waits(requests, band)
            label = band or "all"
            out[f"p50_wait_s_{label}"] = round(percentile(waits, 0.50), 2)
            out[f"p95_wait_s_{label}"] = round(percentile(waits, 0.95), 2)
            out[f"mean_wait_s_{label}"] = round(sum(waits) / len(waits), 2) if waits else 0.0
        return out


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank on sorted `values`."""
    if not values:
        return 0.0
    return values[max(math.ceil(q * len(values)) - 1, 0)]


class Policy:
    """What a machine asks of a policy; each method may call back into the machine."""

    name = "policy"

    def attach(self, machine: Machine) -> None:
        self.m = machine

    def on_arrival(self, req: Request) -> None: ...
    def on_done(self, req: Request) -> None: ...
    def on_ready(self, model: str) -> None: ...
    def on_stopped(self, model: str) -> None: ...
    def on_tick(self) -> None: ...


class Machine:
    def __init__(self, trace: Trace, policy: Policy) -> None:
        self.trace = trace
        self.policy = policy
        self.now = 0.0
        self.resident: dict[str, int] = {}  # loaded and not stopped: MB
        self.outcome = Outcome(policy.name)
        self._heap: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self._loader_free_at = 0.0
        self._requests = {r.rid: r for r in trace.requests}
        policy.attach(self)

    # -- what a policy may ask --------------------------------------------------------

    def free_mb(self) -> int:
        return self.trace.capacity_mb - sum(self.resident.values())

    def serve(self, rid: int) -> None:
        req = self._requests[rid]
        assert rid not in self.outcome.granted, f"request {rid} granted twice"
        assert req.model in self.resident, f"{req.model} served while not loaded"
        self.outcome.granted[rid] = self.now
        self.outcome.order.append(req.model)
        self._push(self.now + req.service_s, "done", req)

    def load(self, model: str) -> None:
        start = max(self.now, self._loader_free_at)
        end = start + self.trace.load_s(model)
        self._loader_free_at = end
        self.outcome.loads.append((model, start, end))
        self._push(end, "ready", model)

    def stop(self, models: Sequence[str]) -> None:
        for model in models:
            self._push(self.now + self.trace.stop_s, "stopped", model)

    # -- the run --------------------------------------------------------------------

    def _push(self, at: float, kind: str, item: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, kind, item))

    def run(self) -> Outcome:
        for req in self.trace.requests:
            self._push(req.at, "arrive", req)
        self._push(TICK_S, "tick", None)
        open_requests = len(self.trace.requests)
        while self._heap:
            at, _, kind, item = heapq.heappop(self._heap)
            self.now = at
            match kind:
                case "arrive":
                    self.policy.on_arrival(item)
                case "done":
                    self.outcome.finished[item.rid] = at
                    open_requests -= 1
                    self.policy.on_done(item)
                case "ready":
                    mem = self.trace.models[item].mem_mb
                    assert mem <= self.free_mb(), f"{item} loaded into {self.free_mb()} MB"
                    self.resident[item] = mem
                    self.policy.on_ready(item)
                case "stopped":
                    del self.resident[item]
                    self.policy.on_stopped(item)
                case "tick":
                    self.policy.on_tick()
                    if open_requests - len(self.outcome.rejected) > 0:
                        self._push(at + TICK_S, "tick", None)
        return self.outcome


class Ours(Policy):
    """The runner's scheduler core and eviction policy, unchanged, as the `Effects`' client."""

    def __init__(self, trace: Trace, *, swap_max_wait_s: float | None = None) -> None:
        defaults = SchedulerConfig()
        self.name = (
            "ours" if swap_max_wait_s is None else f"ours(swap_max_wait={swap_max_wait_s:g})"
        )
        policies = {
            m.name: ModelPolicy(m.mem_mb, m.concurrency, pinned=m.pinned, autoload=True)
            for m in trace.models.values()
        }
        self.config = SchedulerConfig(
            max_queue_depth=10**9,
            queue_timeout_s=None,
            models=policies,
            unlisted_ready=False,
            swap_max_wait_s=defaults.swap_max_wait_s
            if swap_max_wait_s is None
            else swap_max_wait_s,
        )

    def attach(self, machine: Machine) -> None:
        super().attach(machine)
        self.core = Scheduler(self.config, _MachineEffects(machine))

    def on_arrival(self, req: Request) -> None:
        request = AdmissionRequest(str(req.rid), req.model, req.tenant, req.band, 100, 100)
        self.core.handle(RequestArrived(req.rid, request, self.m.now))

    def on_done(self, req: Request) -> None:
        self.core.handle(ServeDone(req.rid, None, self.m.now))

    def on_ready(self, model: str) -> None:
        spec = self.m.trace.models[model]
        self.core.handle(ModelReady(model, spec.concurrency, spec.mem_mb, self.m.now))

    def on_stopped(self, model: str) -> None:
        self.core.handle(ModelStopped(model, self.m.now))

    def on_tick(self) -> None:
        self.core.handle(Tick(self.m.now))


class _MachineEffects:
    """`Effects` over the simulated machine."""

    def __init__(self, machine: Machine) -> None:
        self.m = machine

    def grant(self, ticket: Ticket, queue_wait_ms: int) -> bool:
        self.m.serve(ticket.ticket_id)
        return True

    def reject(self, ticket: Ticket, error: QuorumError) -> None:
        self.m.outcome.rejected[ticket.ticket_id] = error.code

    def start_load(self, model: str, policy: ModelPolicy) -> None:
        self.m.load(model)

    def stop_model(self, model: str, sleep: bool, cut: QuorumError | None = None) -> None:
        self.m.stop([model])

    def notify(self, notice: ModelNotice) -> None:
        return None  # refused loads: their waiters are rejected by the scheduler, counted there

    def free_memory_mb(self) -> int:
        return self.m.free_mb()

    def log_decision(self, text: str) -> None:
        self.m.outcome.decisions += 1
