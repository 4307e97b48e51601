"""The Retry-After bench's trace replayed through the real scheduler core on a simulated
clock, once per `Retry-After` policy (`policies.py`), to compare them in seconds of CPU.

    .venv/bin/python -m bench.retryafter.sim [--traces spikes,bursts] [--cycles 8] [--seeds 5]
        [--headrooms 1.3,1.67]

The engine is simulated like the HTTP bench's fake: `--parallel` slots, each request
takes `--latency-ms`. A client refused with `queue_full` comes back after exactly its
`Retry-After` (up to `MAX_RETURNS` times); the core is `runner.scheduler.core.Scheduler`
with main's defaults (`MAX_QUEUE_DEPTH` 16, `QUEUE_TIMEOUT_MS` 30000), its
`_retry_after` replaced by the policy under test. Same analysis as the HTTP bench.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import json
import math
import statistics
from collections.abc import Callable
from typing import Any

from bench.retryafter import analysis, policies, trace
from bench.retryafter.experiment import scheduler_with
from runner.scheduler.config import SchedulerConfig
from runner.scheduler.errors import SchedulerError
from runner.scheduler.events import RequestArrived, ServeDone, Tick, Ticket
from runner.scheduler.grants import AdmissionRequest, Usage

MODEL = "echo"
MAX_RETURNS = 8
TICK_S = 0.1


class Replay:
    def __init__(
        self, policy: Callable[[policies.Known], int], parallel: int, latency_s: float
    ) -> None:
        config = SchedulerConfig(model_concurrency={MODEL: parallel})
        self.max_depth = config.max_queue_depth
        self.core = scheduler_with(policy)(config, self, started_at=0.0)
        self.latency_s = latency_s
        self.now = 0.0
        self.heap: list[tuple[float, int, str, int]] = []
        self.seq = 0
        self.attempts: dict[int, analysis.Attempt] = {}  # by ticket id
        self.log: list[analysis.Attempt] = []

    def _push(self, at: float, kind: str, ref: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, self.seq, kind, ref))

    # Effects
    def grant(self, ticket: Ticket, queue_wait_ms: int) -> bool:
        a = self.attempts[ticket.ticket_id]
        a.queue_wait_s = self.now - a.sent
        self._push(self.now + self.latency_s, "done", ticket.ticket_id)
        return True

    def reject(self, ticket: Ticket, error: SchedulerError) -> None:
        a = self.attempts.pop(ticket.ticket_id)
        a.done, a.status, a.code = self.now, error.status, error.code
        a.retry_after = int(error.headers["Retry-After"]) if error.headers else None
        if a.refused and a.retry_after is not None and a.attempt < MAX_RETURNS:
            self.retries.append((self.now + a.retry_after, a.client, a.attempt + 1))

    def run(self, arrivals: list[tuple[float, str]], end_s: float) -> list[analysis.Attempt]:
        self.retries: list[tuple[float, int, int]] = []
        fresh = [(t, i, 0) for i, (t, _) in enumerate(arrivals)]
        tenants = {i: tenant for i, (_, tenant) in enumerate(arrivals)}
        pending = list(fresh)
        heapq.heapify(pending)
        t = TICK_S
        while t < end_s + 60:
            self._push(t, "tick", 0)
            t += TICK_S
        ticket = 0
        while self.heap or pending or self.retries:
            for r in self.retries:
                heapq.heappush(pending, r)
            self.retries.clear()
            nxt_event = self.heap[0][0] if self.heap else math.inf
            nxt_arrival = pending[0][0] if pending else math.inf
            if min(nxt_event, nxt_arrival) > end_s + 60:
                break
            if nxt_arrival < nxt_event:
                at, client, attempt = heapq.heappop(pending)
                self.now = at
                ticket += 1
                a = analysis.Attempt(client, attempt, at, tenant=tenants[client])
                self.attempts[ticket] = a
                self.log.append(a)
                req = AdmissionRequest(f"r{ticket}", MODEL, tenants[client], "normal", 16, 16)
                self.core.handle(RequestArrived(ticket, req, at))
                continue
            at, _, kind, ref = heapq.heappop(self.heap)
            self.now = at
            if kind == "tick":
                self.core.handle(Tick(at))
            else:
                a = self.attempts.pop(ref)
                a.done, a.status = at, 200
                self.core.handle(ServeDone(ref, Usage(16, 16), at))
        return self.log


def run_policy(
    name: str,
    kind: str,
    cycles: int,
    seeds: int,
    parallel: int,
    latency_s: float,
    policy: Callable[[policies.Known], int] | None = None,
) -> dict[str, Any]:
    capacity = parallel / latency_s
    end_s = trace.duration_s(kind, cycles)
    results = []
    for seed in range(1, seeds + 1):
        arrivals = trace.TRACES[kind](capacity, cycles, seed)
        chosen = policy or policies.POLICIES[name]
        log = Replay(chosen, parallel, latency_s).run(arrivals, end_s)
        results.append(analysis.analyse(log, 16, end_s))
    return {"policy": name, "runs": results}


def _spread(values: list[float]) -> str:
    values = [v for v in values if v == v]
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--traces", default="spikes,bursts")
    p.add_argument("--cycles", type=int, default=8)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("--latency-ms", type=float, default=270.0)
    p.add_argument(
        "--headrooms", default="", help="also `spread` with these headrooms (e.g. 1.3,1.67)"
    )
    p.add_argument("--json", action="store_true", help="print every run's analysis as JSON")
    args = p.parse_args(argv)
    candidates: dict[str, Callable[[policies.Known], int]] = dict(policies.POLICIES)
    for h in filter(None, args.headrooms.split(",")):
        candidates[f"spread h={h}"] = functools.partial(policies.spread, headroom=float(h))
    latency_s = args.latency_ms / 1e3
    out = {
        kind: [
            run_policy(name, kind, args.cycles, args.seeds, args.parallel, latency_s, policy)
            for name, policy in candidates.items()
        ]
        for kind in args.traces.split(",")
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(
        "| trace | policy | admitted on return | over-wait p50 | over-wait p90"
        " | over-wait in line p50 | Retry-After p50 (s) |\n|---|---|---:|---:|---:|---:|---:|"
    )
    for kind, results in out.items():
        for res in results:
            runs = res["runs"]
            given = [
                s
                for r in runs
                for c in r["retry_after_given"].values()
                for s, n in c.items()
                for _ in range(n)
            ]
            print(
                f"| {kind} | {res['policy']} "
                f"| {_spread([r['admitted_on_return'] for r in runs])} "
                f"| {_spread([r['over_wait']['p50'] for r in runs])} "
                f"| {_spread([r['over_wait']['p90'] for r in runs])} "
                f"| {_spread([r['over_wait_in_line_queue_full']['p50'] for r in runs])} "
                f"| {statistics.median(given) if given else '-'} |"
            )


if __name__ == "__main__":
    main()
