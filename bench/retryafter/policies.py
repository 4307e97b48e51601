"""`Retry-After` policies: the runner's, the one it had before, and other candidates.

Each is a pure function of `Known`, what the scheduler knows when it refuses a request.
`sim.py` replays the trace through the real scheduler core with each of them;
`proposal_runner.py` runs the real runner with one of them in place of main's.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from runner.scheduler import retry_after
from tenants.memory_store import Window
from tenants.ratelimit import seconds_until_below


@dataclass(frozen=True, slots=True)
class Known:
    """What the scheduler knows at a refusal (seconds; rates per second)."""

    position: int  # queue depth + 1 (what the runner passed before 2026-11-25)
    drain_per_s: float  # `DrainMeter.rate`: completions over the last 60 s of wall time
    fallback_s: float  # the queue timeout
    concurrency: int  # slots of the model(s) the queue waits for
    in_flight_ages: tuple[float, ...]  # how long each request in a slot has run
    service_s: float | None  # mean service time of recent completions; None before any
    pending_returns: int  # refused clients whose Retry-After has not elapsed yet


class DrainMeter:
    """Slots freed per second (requests finishing at the engine) over the last `window_s`:
    the `drain_rate` policy's input, as the runner measured it up to bf9f859.

    Completions are counted in one-second buckets, so any rate is measured, not
    only rates below a sample cap. Before a full window has passed, the rate is
    taken over the time since start, so a fresh runner does not report an
    inflated rate.
    """

    def __init__(self, window_s: float, started_at: float) -> None:
        self._window_s = window_s
        self._started_at = started_at
        self._buckets: deque[list[int]] = deque()  # [second, completions]
        self._total = 0

    def record(self, at: float) -> None:
        second = math.floor(at)
        buckets = self._buckets
        if buckets and buckets[-1][0] == second:
            buckets[-1][1] += 1
        else:
            buckets.append([second, 1])
        self._total += 1

    def rate(self, now: float) -> float:
        buckets = self._buckets
        while buckets and now - (buckets[0][0] + 1) > self._window_s:
            self._total -= buckets.popleft()[1]
        span = min(self._window_s, now - self._started_at)
        if not self._total or span <= 0:
            return 0.0
        return self._total / max(span, 1.0)


def drain_rate(k: Known) -> int:
    """The runner's formula up to bf9f859: `ceil((depth + 1) / measured drain rate)`, the
    queue timeout when nothing drained, clamped to 1..3600."""
    seconds = k.position / k.drain_per_s if k.drain_per_s > 0 else k.fallback_s
    return min(max(math.ceil(seconds), 1), 3600)


def runner(k: Known) -> int:
    """The runner's own (`runner/scheduler/retry_after.py`), fed the same facts: every
    request in flight with the mean service time."""
    running = [(age, k.service_s) for age in k.in_flight_ages]
    return retry_after.retry_after_s(running, k.pending_returns)


def _service_s(k: Known) -> float:
    """Mean service time; before any completion, at least what the oldest has run (>= 1 s)."""
    oldest = max(k.in_flight_ages, default=0.0)
    return k.service_s if k.service_s is not None else max(oldest, 1.0)


def _next_free_s(k: Known) -> float:
    """Seconds until the first slot frees: the oldest request's expected remaining time."""
    s = _service_s(k)
    return max(0.0, min((s - age for age in k.in_flight_ages), default=0.0))


def _clamp(seconds: float) -> int:
    return min(max(math.ceil(seconds - 1e-9), 1), 3600)


def capacity_full_queue(k: Known) -> int:
    """Main's formula with the engine's capacity (slots / service time), not the wall-clock
    completion rate: the time for the whole queue ahead to drain."""
    return _clamp(k.position * _service_s(k) / k.concurrency)


def next_place(k: Known) -> int:
    """When the first place frees (the next slot to finish), the same for every client."""
    return _clamp(_next_free_s(k))


def spread(k: Known, headroom: float = 1.0) -> int:
    """When this client's place frees: the next slot to finish, plus one service
    interval (service time / slots) for each refused client due back before it,
    stretched by `headroom` because new arrivals take some of the freed places too."""
    interval = _service_s(k) / k.concurrency
    return _clamp(_next_free_s(k) + headroom * k.pending_returns * interval)


def proposal(k: Known) -> int:
    """The proposal (`docs/benchmarks.md`, P16): `spread` leaving a third of the freed
    places to new arrivals (headroom 1.5); the runner has it since (`runner`)."""
    return spread(k, 1.5)


def spread_x2(k: Known) -> int:
    return spread(k, 2.0)


def rate_limit_spread(
    pending: int, limit: int, expiry: int, window: Window, headroom: float = 1.0
) -> int:
    """A 429's `Retry-After` that spreads a tenant's refused clients: the seconds until the
    tenant's sliding window has room for this client and `headroom` x the `pending` ones
    due back before it (the limiter's own `seconds_until_below` for the part that fits in
    one window, plus a whole window for each further `limit`)."""
    need = 1 + math.ceil(headroom * pending)
    windows, rest = divmod(need - 1, limit)
    seconds = seconds_until_below(limit - rest, expiry, window) + windows * expiry
    return _clamp(seconds + 1e-6)


POLICIES: dict[str, Callable[[Known], int]] = {
    "drain_rate": drain_rate,
    "runner": runner,
    "capacity_full_queue": capacity_full_queue,
    "next_place": next_place,
    "spread": spread,
    "proposal": proposal,
    "spread_x2": spread_x2,
}


class Bookkeeping:
    """The extra state the candidates need, kept beside the core: grant times of requests
    in slots, recent service times, and the return times promised to refused clients."""

    def __init__(self, samples: int = 64) -> None:
        self.granted_at: dict[int, float] = {}
        self.service: deque[float] = deque(maxlen=samples)
        self.promised: deque[float] = deque()

    def granted(self, ticket_id: int, now: float) -> None:
        self.granted_at[ticket_id] = now

    def done(self, ticket_id: int, now: float) -> None:
        started = self.granted_at.pop(ticket_id, None)
        if started is not None:
            self.service.append(now - started)

    def promise(self, at: float) -> None:
        self.promised.append(at)

    def pending(self, now: float) -> int:
        self.promised = deque(sorted(t for t in self.promised if t > now))
        return len(self.promised)

    def mean_service_s(self) -> float | None:
        return sum(self.service) / len(self.service) if self.service else None

    def ages(self, now: float) -> tuple[float, ...]:
        return tuple(now - t for t in self.granted_at.values())
