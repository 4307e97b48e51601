"""The rate limiter against memory and Redis stores (one suite), and its pure window math."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from limits.aio.storage import SlidingWindowCounterSupport, Storage

from tenants.config import TenantsConfig, build_config
from tenants.errors import RateLimitExceeded
from tenants.memory_store import MemoryWindowStorage
from tenants.ratelimit import RateLimiter, decide, seconds_until_below
from tenants.rates import Rate
from tenants.storage import close_storage, storage_from_url

T0 = 1_745_880_000.0  # a minute boundary


class FakeClock:
    """Time that moves only when a test says so."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["memory", "redis"])
async def storage(request: pytest.FixtureRequest, clock: FakeClock) -> AsyncIterator[Storage]:
    """A memory store on the fake clock, or the library's Redis store on a real redis-server
    (with a timeout of 5 s, not the runner's 0.25 s: these tests pin what the store counts,
    and a loaded two-core machine may take longer than 0.25 s to answer; the fail-fast
    timeout has tests of its own)."""
    if request.param == "memory":
        yield MemoryWindowStorage(clock)
        return
    server = request.getfixturevalue("redis_server")
    store = storage_from_url(server.url, timeout_s=5.0)
    yield store
    await close_storage(store)


def env_config(**env: str) -> TenantsConfig:
    return build_config({k.replace("__", "-"): v for k, v in env.items()})


async def test_storage_sliding_window_contract(storage: Storage) -> None:
    """Both stores admit up to the limit, report the count, and clear it."""
    windows = storage
    assert isinstance(windows, SlidingWindowCounterSupport)
    assert [await windows.acquire_sliding_window_entry("k", 3, 60) for _ in range(4)] == [
        True,
        True,
        True,
        False,
    ]
    previous, _, current, current_ttl = await windows.get_sliding_window("k", 60)
    assert (previous, current) == (0, 3)
    assert 60 < current_ttl <= 120
    assert not await windows.acquire_sliding_window_entry("k", 3, 60, amount=4)
    await windows.clear_sliding_window("k", 60)
    assert (await windows.get_sliding_window("k", 60))[2] == 0


async def test_ratelimiter_env_limit_community_x_five_per_minute(
    storage: Storage, clock: FakeClock
) -> None:
    """`TENANT_RATE_LIMIT_community-x=5req/min`: 5 requests pass, the 6th gets the seed's 429."""
    limiter = RateLimiter(
        env_config(TENANT_RATE_LIMIT_community__x="5req/min"), storage, clock=clock
    )
    decisions = [await limiter.check("community-x") for _ in range(5)]
    assert [d.remaining for d in decisions if d is not None] == [4, 3, 2, 1, 0]
    with pytest.raises(RateLimitExceeded) as info:
        await limiter.check("community-x")
    error = info.value
    assert (error.status, error.code, error.type) == (
        429,
        "rate_limit_exceeded",
        "rate_limit_error",
    )
    assert str(error) == "Tenant community-x exceeded 5 req/min"
    assert error.extra["limit"] == 5 and error.extra["remaining"] == 0
    retry = int(error.headers["Retry-After"])
    assert 1 <= retry <= 61  # at most one window, rounded up past the boundary
    assert error.extra["resetAt"] == int(clock.now) + retry
    assert error.headers["RateLimit-Limit"] == "5"
    assert error.headers["RateLimit-Remaining"] == "0"
    assert error.headers["RateLimit-Reset"] == str(retry)


async def test_ratelimiter_headers_on_allowed_response(storage: Storage, clock: FakeClock) -> None:
    """Every limited response carries RateLimit-Limit/-Remaining/-Reset as encoded bytes."""
    limiter = RateLimiter(env_config(DEFAULT_RATE_LIMIT="10req/min"), storage, clock=clock)
    decision = await limiter.hit("anyone")
    assert decision is not None and decision.allowed
    headers = dict(limiter.headers(decision))
    assert headers[b"ratelimit-limit"] == b"10"
    assert headers[b"ratelimit-remaining"] == b"9"
    assert 0 < int(headers[b"ratelimit-reset"]) <= 120


async def test_ratelimiter_tenants_have_separate_windows(
    storage: Storage, clock: FakeClock
) -> None:
    """One tenant using up the default limit does not touch another tenant's window."""
    limiter = RateLimiter(env_config(DEFAULT_RATE_LIMIT="2req/min"), storage, clock=clock)
    results = [await limiter.hit(t) for t in ("a", "a", "a", "b", "b", "b")]
    assert [r.allowed for r in results if r is not None] == [True, True, False] * 2


async def test_ratelimiter_own_limit_beats_default(storage: Storage, clock: FakeClock) -> None:
    """A tenant's own limit applies instead of the default."""
    config = env_config(DEFAULT_RATE_LIMIT="1req/min", TENANT_RATE_LIMIT_big="3req/min")
    limiter = RateLimiter(config, storage, clock=clock)
    allowed = [(await limiter.hit("big")) for _ in range(4)]
    assert [d.allowed for d in allowed if d is not None] == [True, True, True, False]


class ExplodingStore(MemoryWindowStorage):
    """A store that fails the test if it is ever asked anything."""

    async def acquire_sliding_window_entry(
        self, key: str, limit: int, expiry: int, amount: int = 1
    ) -> bool:
        raise AssertionError("the store was called for an unlimited tenant")


async def test_ratelimiter_unlimited_tenant_skips_store() -> None:
    """No own limit and no default (or `unlimited`): allowed, no headers, no store call."""
    config = env_config(TENANT_RATE_LIMIT_vip="unlimited")
    limiter = RateLimiter(config, ExplodingStore())
    assert await limiter.check("vip") is None
    assert await limiter.check("someone") is None
    assert limiter.headers(None) == []


async def test_ratelimiter_memory_window_slides_with_clock(clock: FakeClock) -> None:
    """Memory windows follow the injected clock: refused now, allowed once enough time passed."""
    limiter = RateLimiter(env_config(DEFAULT_RATE_LIMIT="5req/min"), clock=clock)
    for _ in range(5):
        await limiter.check("t")
    clock.now += 30
    refused = await limiter.hit("t")
    # 5 hits at T0 count fully until T0+60; just past it they start to decay
    assert refused is not None and not refused.allowed and refused.retry_after_s == 31
    clock.now += refused.retry_after_s
    again = await limiter.hit("t")
    assert again is not None and again.allowed
    clock.now += 180
    fresh = await limiter.hit("t")
    assert fresh is not None and fresh.remaining == 4


async def test_memory_store_sweeps_expired_counters(clock: FakeClock) -> None:
    """Counters of tenants that went quiet are dropped, so unknown tenant ids cannot pile up."""
    store = MemoryWindowStorage(clock, sweep_interval_s=10)
    for i in range(100):
        await store.acquire_sliding_window_entry(f"t{i}", 5, 1)
    clock.now += 11
    await store.acquire_sliding_window_entry("late", 5, 1)
    assert len(store) == 1


RATE = Rate(10, "minute")


@pytest.mark.parametrize(
    ("window", "target", "seconds"),
    [
        ((0, 0.0, 0, 0.0), 10, 0.0),  # empty: below already
        ((0, 0.0, 10, 90.0), 10, 30.0),  # full current window: wait for the shift
        ((0, 0.0, 20, 90.0), 10, 60.0),  # double: shift, then half a window
        ((10, 30.0, 5, 90.0), 10, 0.0),  # exactly at the target: callers round up past it
        ((12, 30.0, 5, 90.0), 10, 5.0),  # 12*(30-t)/60 + 5 < 10  <=>  t > 5
        ((0, 0.0, 3, 90.0), 0, 90.0),  # target 0: only when everything expired
    ],
)
def test_seconds_until_below(
    window: tuple[int, float, int, float], target: int, seconds: float
) -> None:
    """The wait until the weighted count drops below a target follows the window arithmetic."""
    assert seconds_until_below(target, 60, window) == pytest.approx(seconds)


def test_decide_refused_retry_at_least_one_second() -> None:
    """A refusal always tells the client to wait at least 1 s, and resetAt agrees."""
    decision = decide(False, RATE, 60, (10, 0.5, 9, 60.5), T0)
    assert decision.retry_after_s == 1 and decision.reset_at == int(T0) + 1
    assert decision.remaining == 0 and decision.limit == 10


def test_decide_allowed_reset_when_one_request_frees() -> None:
    """Allowed: remaining from the weighted count; reset when the count drops one whole request."""
    decision = decide(True, RATE, 60, (6, 30.0, 4, 90.0), T0)
    # weighted 6*30/60 + 4 = 7 -> remaining 3; below 7 when 6*(30-t)/60 < 3 <=> t > 0
    assert decision.remaining == 3 and decision.retry_after_s == 0
    assert decision.reset_after_s == 1
    empty = decide(True, RATE, 60, (0, 0.0, 0, 90.0), T0)
    assert empty.remaining == 10 and empty.reset_after_s == 0
