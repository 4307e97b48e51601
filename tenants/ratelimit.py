"""Per-tenant sliding-window rate limits on the `limits` library's storage contract.

The algorithm is the library's sliding window counter: a tenant's count is the current
window's hits plus the previous window's, weighted by how much of it still overlaps the
sliding window. Storage is either `MemoryWindowStorage` (in-process, injected clock) or the
library's `RedisStorage` (shared by every replica, keys prefixed `quorum`). Both run the
library's own sliding-window-counter code paths (`acquire_sliding_window_entry`, then
`get_sliding_window`); stores with `acquire_and_read` do the two in one call (Redis: one
pipelined round trip). Key, limit and expiry are computed once per tenant, not per request.

Header semantics (all seconds are whole and rounded up):
- `RateLimit-Limit`: requests per window; `RateLimit-Remaining`: requests left now;
- `RateLimit-Reset`: seconds until one more request fits; on a 429 equal to `Retry-After`:
  until there is room for this client after the tenant's refused clients due back before
  it, so a refused batch comes back spread over the window, not all into one place;
- body `resetAt` = now + `RateLimit-Reset`, in Unix seconds.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from math import ceil, floor
from typing import Protocol, runtime_checkable

from limits.aio.storage import SlidingWindowCounterSupport, Storage
from limits.errors import StorageError

from faults.record import record
from tenants.config import TenantsConfig
from tenants.errors import RateLimitExceeded, RateLimitUnavailable, TenantError
from tenants.memory_store import Clock, MemoryWindowStorage, Window
from tenants.rates import Rate

log = logging.getLogger("quorum.tenants.ratelimit")

StorageErrorObserver = Callable[[str, BaseException], None]
"""Called with (tenant, error) for every request decided without the store."""


@runtime_checkable
class AcquireAndRead(Protocol):
    """A store that acquires an entry and reads the window after it in one call."""

    async def acquire_and_read(self, key: str, limit: int, expiry: int) -> tuple[bool, Window]: ...


_EPSILON = 1e-6
_MAX_CACHED_TENANTS = 10_000
_MAX_PROMISES = 10_000  # return times kept per tenant


@record
class RateDecision:
    """The outcome of one hit: allowed or not, and what the headers should say."""

    allowed: bool
    rate: Rate
    remaining: int
    reset_at: int  # Unix seconds when one more request fits
    reset_after_s: int  # seconds until then (RateLimit-Reset)
    retry_after_s: int  # 0 when allowed; >= 1 when refused (Retry-After)

    @property
    def limit(self) -> int:
        return self.rate.amount


def seconds_until_below(target: int, expiry: int, window: Window) -> float:
    """Seconds until the weighted count drops below `target`, if no request arrives.

    1. Below already: 0.
    2. While the current window runs, only the previous window's weight decays: if the
       current count alone is below `target`, solve p * (pttl - t) / E + c < target.
    3. Otherwise wait for the window to shift (at cttl - E), after which the old current
       count decays: solve c * (E - x) / E < target. `target` <= 0 is never reached.
    """
    previous, previous_ttl, current, current_ttl = window
    # 1. below already
    if previous * previous_ttl / expiry + current < target:
        return 0.0
    # 2. the previous window's weight decays
    if current < target:
        return max(0.0, previous_ttl - (target - current) * expiry / previous)
    # 3. after the shift, the current count decays
    if target <= 0:
        return float(current_ttl)
    return max(0.0, current_ttl - expiry) + expiry * (1 - target / current)


def decide(
    allowed: bool, rate: Rate, expiry: int, window: Window, now: float, pending: int = 0
) -> RateDecision:
    """Turn a hit's outcome and the window read after it into a decision.

    1. Remaining: 0 when refused, else limit - floor(weighted count), at least 0.
    2. Refused: retry (and reset) when the count has room for this client and the
       `pending` refused clients due back before it (with `windows, rest =
       divmod(pending, limit)`: the count below `limit - rest`, plus `windows` whole
       windows), at least 1 s. With none pending: when the count drops below the limit.
    3. Allowed: reset when the count drops one whole request (remaining goes up), 0 when
       the quota is full.
    """
    previous, previous_ttl, current, _ = window
    used = floor(previous * previous_ttl / expiry + current)
    # 1. remaining
    remaining = 0 if not allowed else max(0, rate.amount - used)
    # 2. refused
    if not allowed:
        windows, rest = divmod(max(pending, 0), rate.amount)
        wait = seconds_until_below(rate.amount - rest, expiry, window) + windows * expiry
        retry = max(1, ceil(wait + _EPSILON))
        return RateDecision(False, rate, 0, ceil(now) + retry, retry, retry)
    # 3. allowed
    reset = 0 if used <= 0 else ceil(seconds_until_below(used, expiry, window) + _EPSILON)
    return RateDecision(True, rate, remaining, ceil(now) + reset, reset, 0)


@dataclass(frozen=True, slots=True)
class _Plan:
    rate: Rate
    key: str
    expiry: int


class RateLimiter:
    """Decides, per request, whether a tenant is within its rate limit."""

    def __init__(
        self,
        config: TenantsConfig,
        storage: Storage | None = None,
        *,
        clock: Clock = time.time,
        fail_open: bool = True,
        on_storage_error: StorageErrorObserver | None = None,
        outage_probe_s: float = 1.0,
    ) -> None:
        """`storage` must support the sliding window counter (memory or Redis); default:
        a `MemoryWindowStorage` on `clock`. While the store is failing, it is tried again
        at most every `outage_probe_s`; in between requests are decided without it."""
        storage = storage if storage is not None else MemoryWindowStorage(clock)
        if not isinstance(storage, SlidingWindowCounterSupport):
            raise TypeError(f"{type(storage).__name__} has no sliding window counter support")
        self._config = config
        self._storage = storage
        self._windows: SlidingWindowCounterSupport = storage
        self._combined = storage if isinstance(storage, AcquireAndRead) else None
        self._clock = clock
        self.fail_open = fail_open
        self._on_storage_error = on_storage_error
        self._outage_probe_s = outage_probe_s
        self._plans: dict[str, _Plan | None] = {}
        self._due: dict[str, deque[float]] = {}  # return times told to refused clients
        self._down_since: float | None = None
        self._probe_at = 0.0
        self._last_error: BaseException | None = None

    @property
    def storage(self) -> Storage:
        return self._storage

    async def hit(self, tenant: str) -> RateDecision | None:
        """Count one request for `tenant`.

        1. No limit for this tenant (own or default): None, without touching the store.
        2. During an outage, before the next probe: decide without the store.
        3. Acquire an entry and read the window (memory: no I/O; Redis: one round trip).
        4. Store failure: start (or continue) the outage and decide without the store.
        5. Success after an outage: log the recovery once.
        6. Return the decision; a refusal counts the tenant's refused clients still due
           back (`decide`'s `pending`) and is itself due back at its `Retry-After`.

        Deciding without the store means None (allowed, no headers) when failing open and
        `RateLimitUnavailable` (503) when failing closed.
        """
        # 1. unlimited
        plan = self._plans.get(tenant, _MISSING_PLAN)
        if plan is _MISSING_PLAN:
            plan = self._plan(tenant)
        if plan is None:
            return None
        # 2. outage, before the next probe
        now = self._clock()
        if self._down_since is not None and now < self._probe_at:
            return self._without_store(tenant, now, None)
        # 3. the store
        try:
            if self._combined is not None:
                allowed, window = await self._combined.acquire_and_read(
                    plan.key, plan.rate.amount, plan.expiry
                )
            else:
                allowed = await self._windows.acquire_sliding_window_entry(
                    plan.key, plan.rate.amount, plan.expiry
                )
                window = await self._windows.get_sliding_window(plan.key, plan.expiry)
        except (StorageError, OSError) as exc:
            # 4. failure
            return self._without_store(tenant, now, exc)
        # 5. recovery
        if self._down_since is not None:
            log.warning(
                "rate-limit store is back after %.1f s; limits are enforced again",
                now - self._down_since,
            )
            self._down_since = None
        # 6. decision
        now = self._clock()
        if allowed:
            return decide(True, plan.rate, plan.expiry, window, now)
        due = self._returns(tenant, now)
        decision = decide(False, plan.rate, plan.expiry, window, now, pending=len(due))
        due.append(now + decision.retry_after_s)
        return decision

    async def check(self, tenant: str) -> RateDecision | None:
        """`hit`, raising `RateLimitExceeded` (429) when the tenant is over its limit."""
        decision = await self.hit(tenant)
        if decision is not None and not decision.allowed:
            raise self.exceeded(tenant, decision)
        return decision

    @staticmethod
    def exceeded(tenant: str, decision: RateDecision) -> TenantError:
        """The 429 error for a refused decision."""
        return RateLimitExceeded(
            tenant=tenant,
            rate=decision.rate.text,
            limit=decision.limit,
            remaining=decision.remaining,
            resetAt=decision.reset_at,
            reset_after=decision.reset_after_s,
            retry_after=decision.retry_after_s,
        )

    @staticmethod
    def headers(decision: RateDecision | None) -> list[tuple[bytes, bytes]]:
        """`RateLimit-*` response headers (lower-case ASGI names); none when unlimited."""
        if decision is None:
            return []
        return [
            (b"ratelimit-limit", b"%d" % decision.rate.amount),
            (b"ratelimit-remaining", b"%d" % decision.remaining),
            (b"ratelimit-reset", b"%d" % decision.reset_after_s),
        ]

    def reload(self, config: TenantsConfig) -> None:
        """Use a new configuration from the next request on (a governed tenant-policy
        change, SIGHUP): the windows already counted stay."""
        self._config = config
        self._plans.clear()

    async def aclose(self) -> None:
        """Release the store's connections (see `tenants.storage.close_storage`)."""
        from tenants.storage import close_storage

        await close_storage(self._storage)

    def _plan(self, tenant: str) -> _Plan | None:
        rate = self._config.rate_for(tenant)
        plan = None if rate is None else _Plan(rate, rate.item().key_for(tenant), rate.period_s)
        if len(self._plans) >= _MAX_CACHED_TENANTS:
            self._plans.clear()
        self._plans[tenant] = plan
        return plan

    def _returns(self, tenant: str, now: float) -> deque[float]:
        """The return times told to the tenant's refused clients that have not come yet."""
        due = self._due.get(tenant)
        if due is None:
            if len(self._due) >= _MAX_CACHED_TENANTS:
                self._due.clear()
            due = self._due[tenant] = deque(maxlen=_MAX_PROMISES)
        while due and due[0] <= now:
            due.popleft()
        return due

    def _without_store(
        self, tenant: str, now: float, exc: BaseException | None
    ) -> RateDecision | None:
        """Decide while the store is unreachable: allow (fail open) or refuse (fail closed)."""
        if exc is not None:
            self._last_error = exc
            self._probe_at = now + self._outage_probe_s
            if self._down_since is None:
                self._down_since = now
                log.error(
                    "rate-limit store unreachable (%s); failing %s until it is back",
                    exc,
                    "open: requests are allowed" if self.fail_open else "closed: 503",
                )
        error = self._last_error if self._last_error is not None else RuntimeError("store down")
        if self._on_storage_error is not None:
            self._on_storage_error(tenant, error)
        if self.fail_open:
            return None
        raise RateLimitUnavailable(retry_after=ceil(max(self._probe_at - now, 1.0)))


_MISSING_PLAN = _Plan(Rate(1, "second"), "", 1)
