"""One suite for the nonce stores (memory, SQLite and a real Redis), plus each store's
specifics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from governance.errors import NonceStoreUnavailable
from governance.nonces import MemoryNonceStore, NonceStore, RedisNonceStore, SqliteNonceStore
from tests.governance.support import Clock
from tests.support.redis_cluster import redis_url
from tests.support.redis_server import RedisServer


@pytest.fixture(params=["memory", "sqlite", "redis", "cluster"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[NonceStore]:
    if request.param == "memory":
        yield MemoryNonceStore(Clock())
        return
    if request.param == "sqlite":
        sqlite_store = SqliteNonceStore(tmp_path / "state.sqlite3", Clock())
        yield sqlite_store
        await sqlite_store.aclose()
        return
    url = redis_url(request)  # a redis-server, or a three-node cluster
    redis_store = RedisNonceStore.from_url(url)
    yield redis_store
    await redis_store.aclose()


async def test_nonces_first_consume_wins(store: NonceStore) -> None:
    """A nonce is accepted once; the second consume reports it as seen."""
    assert await store.consume("nonce-aaaaaaaaaaaaaaaaaaaaaa", 60) is True
    assert await store.consume("nonce-aaaaaaaaaaaaaaaaaaaaaa", 60) is False


async def test_nonces_are_independent(store: NonceStore) -> None:
    """Consuming one nonce does not affect another."""
    assert await store.consume("nonce-one-aaaaaaaaaaaaaaaaa", 60)
    assert await store.consume("nonce-two-aaaaaaaaaaaaaaaaa", 60)


async def test_nonces_concurrent_consumes_have_one_winner(store: NonceStore) -> None:
    """Many concurrent consumes of one nonce: exactly one True."""
    results = await asyncio.gather(
        *(store.consume("nonce-race-aaaaaaaaaaaaaaaa", 60) for _ in range(20))
    )
    assert results.count(True) == 1


async def test_nonces_refuse_zero_ttl(store: NonceStore) -> None:
    """A ttl under one second is a programming error, not a silent no-op."""
    with pytest.raises(ValueError):
        await store.consume("nonce-ttl-aaaaaaaaaaaaaaaaa", 0)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_nonces_expire_by_clock(kind: str, tmp_path: Path) -> None:
    """The memory and SQLite stores forget a nonce exactly when its ttl has passed on the
    clock."""
    clock = Clock()
    store: MemoryNonceStore | SqliteNonceStore = (
        MemoryNonceStore(clock) if kind == "memory" else SqliteNonceStore(tmp_path / "s.db", clock)
    )
    assert await store.consume("nonce-exp-aaaaaaaaaaaaaaaaa", 10)
    clock.advance(9.999)
    assert not await store.consume("nonce-exp-aaaaaaaaaaaaaaaaa", 10)
    clock.advance(0.001)
    assert await store.consume("nonce-exp-aaaaaaaaaaaaaaaaa", 10)
    await store.aclose()


async def test_nonces_memory_forgets_expired_ones() -> None:
    """The memory store keeps only the nonces still inside their ttl."""
    clock = Clock()
    store = MemoryNonceStore(clock)
    await store.consume("nonce-old-aaaaaaaaaaaaaaaaa", 10)
    clock.advance(10)
    await store.consume("nonce-new-aaaaaaaaaaaaaaaaa", 10)
    assert len(store) == 1


async def test_nonces_sqlite_spent_before_a_reopen_stay_spent(tmp_path: Path) -> None:
    """A nonce spent in the file is still spent for a store opened on it later (a restart),
    until its expiry."""
    clock = Clock()
    path = tmp_path / "state.sqlite3"
    first = SqliteNonceStore(path, clock)
    assert await first.consume("nonce-kept-aaaaaaaaaaaaaaaa", 60)
    await first.aclose()
    second = SqliteNonceStore(path, clock)
    assert not await second.consume("nonce-kept-aaaaaaaaaaaaaaaa", 60)
    clock.advance(60)
    assert await second.consume("nonce-kept-aaaaaaaaaaaaaaaa", 60)
    await second.aclose()


async def test_nonces_sqlite_failure_is_unavailable(tmp_path: Path) -> None:
    """A store whose file can no longer be used raises NonceStoreUnavailable (503)."""
    store = SqliteNonceStore(tmp_path / "state.sqlite3", Clock())
    await store.aclose()
    with pytest.raises(NonceStoreUnavailable) as info:
        await store.consume("nonce-closed-aaaaaaaaaaaaaa", 60)
    assert info.value.status == 503


async def test_nonces_redis_sets_expiry(redis_server: RedisServer) -> None:
    """The Redis store writes the key with the requested ttl (SET NX EX)."""
    store = RedisNonceStore.from_url(redis_server.url)
    assert await store.consume("nonce-ttl-bbbbbbbbbbbbbbbbb", 120)
    client = aioredis.Redis.from_url(redis_server.url)
    ttl = await client.ttl(store.key("nonce-ttl-bbbbbbbbbbbbbbbbb"))
    assert 0 < ttl <= 120
    await client.aclose()
    await store.aclose()


async def test_nonces_redis_unreachable_is_unavailable(redis_server: RedisServer) -> None:
    """With Redis stopped, consume raises NonceStoreUnavailable (503), never True."""
    store = RedisNonceStore.from_url(redis_server.url, timeout_s=1.0)
    redis_server.stop()
    with pytest.raises(NonceStoreUnavailable) as info:
        await store.consume("nonce-down-aaaaaaaaaaaaaaaa", 60)
    assert info.value.status == 503
    await store.aclose()
