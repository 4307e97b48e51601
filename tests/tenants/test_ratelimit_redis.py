"""Rate limits shared through one real Redis, and what happens when Redis goes away."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from tenants.config import build_config
from tenants.errors import RateLimitUnavailable
from tenants.ratelimit import RateLimiter
from tenants.storage import storage_from_url
from tests.support.redis_cluster import redis_url
from tests.support.redis_server import RedisServer

CONFIG = build_config({"TENANT_RATE_LIMIT_community-x": "10req/min"})


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_745_880_000.0

    def __call__(self) -> float:
        return self.now


class Errors:
    """Records the storage-error observer's calls (what the runner turns into a metric)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, BaseException]] = []

    def __call__(self, tenant: str, error: BaseException) -> None:
        self.calls.append((tenant, error))


@pytest.fixture(params=["redis", "cluster"])
async def replicas(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[RateLimiter, RateLimiter]]:
    """Two limiters, each with its own connection pool, sharing one redis-server (or one
    three-node cluster). They wait
    up to 5 s for Redis (not the runner's 0.25 s): these tests pin the shared window, and
    on a loaded 2-core machine opening 15 connections at once took longer than 0.25 s
    (two requests failed open); Redis down is tested below with the short timeout."""
    url = redis_url(request)
    a = RateLimiter(CONFIG, storage_from_url(url, timeout_s=5.0))
    b = RateLimiter(CONFIG, storage_from_url(url, timeout_s=5.0))
    yield a, b
    await a.aclose()
    await b.aclose()


async def test_ratelimiter_redis_replicas_share_one_window_interleaved(
    replicas: tuple[RateLimiter, RateLimiter],
) -> None:
    """Two replicas alternating requests admit exactly 10 of 30 for a 10 req/min tenant."""
    a, b = replicas
    decisions = [await (a if i % 2 else b).hit("community-x") for i in range(30)]
    allowed = [d is not None and d.allowed for d in decisions]
    assert allowed == [True] * 10 + [False] * 20


async def test_ratelimiter_redis_replicas_share_one_window_concurrent(
    replicas: tuple[RateLimiter, RateLimiter],
) -> None:
    """Thirty concurrent requests spread over both replicas: exactly 10 are admitted."""
    a, b = replicas
    decisions = await asyncio.gather(*((a, b)[i % 2].hit("community-x") for i in range(30)))
    assert sum(d is not None and d.allowed for d in decisions) == 10


@pytest.mark.parametrize("replicas", ["redis"], indirect=True)
async def test_ratelimiter_redis_keys_are_prefixed(
    replicas: tuple[RateLimiter, RateLimiter], redis_server: RedisServer
) -> None:
    """Rate-limit keys in Redis start with `quorum:` and name the tenant."""
    import redis.asyncio

    a, _ = replicas
    await a.hit("community-x")
    client = redis.asyncio.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        keys = [str(k) for k in await client.keys("*")]
    finally:
        await client.aclose()
    assert keys and all(k.startswith("quorum:") and "community-x" in k for k in keys)


async def test_ratelimiter_redis_down_fails_open_counts_and_logs_once(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis stopped, fail-open: requests are allowed without headers, each is counted, one log
    line marks the outage; when Redis is back (next probe), limits apply again and one line
    says so."""
    clock, errors = FakeClock(), Errors()
    limiter = RateLimiter(
        CONFIG, storage_from_url(redis_server.url), clock=clock, on_storage_error=errors
    )
    try:
        assert (await limiter.hit("community-x")) is not None
        redis_server.stop()
        with caplog.at_level(logging.WARNING, logger="quorum.tenants.ratelimit"):
            outage = [await limiter.hit("community-x") for _ in range(20)]
            assert outage == [None] * 20
            assert len(errors.calls) == 20 and {t for t, _ in errors.calls} == {"community-x"}
            assert [r.levelname for r in caplog.records] == ["ERROR"]
            redis_server.start()
            assert await limiter.hit("community-x") is None  # before the next probe
            clock.now += 1.0
            back = await limiter.hit("community-x")
        # the restarted redis-server keeps nothing (no persistence): a fresh window
        assert back is not None and back.allowed and back.remaining == 9
        assert [r.levelname for r in caplog.records] == ["ERROR", "WARNING"]
    finally:
        await limiter.aclose()


async def test_ratelimiter_redis_down_fails_closed_with_503(redis_server: RedisServer) -> None:
    """Redis stopped, fail-closed: requests are refused with 503 rate_limit_unavailable."""
    errors = Errors()
    limiter = RateLimiter(
        CONFIG, storage_from_url(redis_server.url), fail_open=False, on_storage_error=errors
    )
    redis_server.stop()
    try:
        for _ in range(3):
            with pytest.raises(RateLimitUnavailable) as info:
                await limiter.hit("community-x")
            error = info.value
            assert (error.status, error.code, error.type) == (
                503,
                "rate_limit_unavailable",
                "server_error",
            )
            assert int(error.headers["Retry-After"]) >= 1
        assert len(errors.calls) == 3
    finally:
        await limiter.aclose()


async def test_ratelimiter_redis_unlimited_tenant_needs_no_redis(redis_server: RedisServer) -> None:
    """A tenant without any limit is served even while Redis is down, and nothing is counted."""
    errors = Errors()
    limiter = RateLimiter(
        CONFIG, storage_from_url(redis_server.url), fail_open=False, on_storage_error=errors
    )
    redis_server.stop()
    try:
        assert await limiter.hit("someone-else") is None
        assert errors.calls == []
    finally:
        await limiter.aclose()


async def test_ratelimiter_redis_counts_once_when_scripts_were_flushed(
    replicas: tuple[RateLimiter, RateLimiter], redis_server: RedisServer
) -> None:
    """After Redis lost its Lua scripts (SCRIPT FLUSH, restart), a hit is counted exactly once."""
    import redis.asyncio

    a, _ = replicas
    await a.hit("community-x")
    client = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        await client.script_flush()
    finally:
        await client.aclose()
    decision = await a.hit("community-x")
    assert decision is not None and decision.allowed and decision.remaining == 8
