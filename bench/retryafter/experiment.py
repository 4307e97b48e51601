"""The real scheduler core with a `Retry-After` policy from `policies.py` in place of its own.

An experiment, not the runner: it subclasses `runner.scheduler.core.Scheduler` and
overrides three of its internals (`_grant`, `on_serve_done`, `_retry_after(now)`) to keep
the bookkeeping the candidates need. `sim.py` replays traces through it; `proposal_runner.py`
puts it inside a real runner. If the core's internals change, this breaks loudly (an
AttributeError at the first request), never silently.
"""

from __future__ import annotations

import contextvars
import dataclasses
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import tenants.ratelimit
from bench.retryafter import policies
from runner.scheduler.config import SchedulerConfig
from runner.scheduler.core import Scheduler
from runner.scheduler.events import ServeDone, Ticket
from tenants.memory_store import Window
from tenants.ratelimit import RateDecision, RateLimiter
from tenants.rates import Rate


def scheduler_with(policy: Callable[[policies.Known], int]) -> type[Scheduler]:
    """A `Scheduler` class whose refusals say what `policy` says."""

    class PolicyScheduler(Scheduler):
        def __init__(
            self, config: SchedulerConfig, effects: Any, *, started_at: float | None = None
        ) -> None:
            super().__init__(config, effects)
            self.book = policies.Bookkeeping()
            start = time.monotonic() if started_at is None else started_at  # the runner's clock
            self.drain = policies.DrainMeter(config.stats_window_s, start)

        def _grant(self, ticket: Ticket, now: float) -> None:
            super()._grant(ticket, now)
            if ticket.ticket_id in self._serving:
                self.book.granted(ticket.ticket_id, now)

        def on_serve_done(self, event: ServeDone) -> None:
            if event.ticket_id in self._serving:
                self.drain.record(event.at)
            self.book.done(event.ticket_id, event.at)
            super().on_serve_done(event)

        def _retry_after(self, now: float) -> int:
            known = policies.Known(
                position=len(self._waiting) + 1,
                drain_per_s=self.drain.rate(now),
                fallback_s=self.config.queue_timeout_s or 30.0,
                concurrency=len(self._serving) or 1,  # refused: every slot is busy
                in_flight_ages=self.book.ages(now),
                service_s=self.book.mean_service_s(),
                pending_returns=self.book.pending(now),
            )
            seconds = policy(known)
            self.book.promise(now + seconds)
            return seconds

    return PolicyScheduler


def install_rate_limit_spread(clock: Callable[[], float]) -> None:
    """Make the rate limiter's 429s say `policies.rate_limit_spread` (an experiment).

    Wraps `RateLimiter.hit` to know the tenant and `tenants.ratelimit.decide` to replace a
    refusal's `Retry-After` (and `RateLimit-Reset`), counting per tenant the refused
    clients whose `Retry-After` has not elapsed yet.
    """
    tenant_var: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="")
    promised: dict[str, deque[float]] = {}
    original_hit = RateLimiter.hit
    original_decide = tenants.ratelimit.decide

    async def hit(self: RateLimiter, tenant: str) -> RateDecision | None:
        tenant_var.set(tenant)
        return await original_hit(self, tenant)

    def decide(
        allowed: bool, rate: Rate, expiry: int, window: Window, now: float, pending: int = 0
    ) -> RateDecision:  # the limiter's own spreading (`pending`) is replaced by ours
        decision = original_decide(allowed, rate, expiry, window, now)
        if allowed:
            return decision
        at = clock()
        due = promised.setdefault(tenant_var.get(), deque())
        while due and due[0] <= at:
            due.popleft()
        retry = policies.rate_limit_spread(len(due), rate.amount, expiry, window)
        due.append(at + retry)
        return dataclasses.replace(
            decision, retry_after_s=retry, reset_after_s=retry, reset_at=math.ceil(now) + retry
        )

    setattr(RateLimiter, "hit", hit)  # noqa: B010 - an experiment, not the runner
    setattr(tenants.ratelimit, "decide", decide)  # noqa: B010
