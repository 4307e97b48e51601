"""One suite for both lease stores (memory and a real Redis), plus each store's specifics."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis

from runner.memory import (
    LeaseLost,
    LeaseStore,
    LeaseStoreUnavailable,
    MemoryLeaseStore,
    RedisLeaseStore,
)
from tests.governance.support import Clock
from tests.support.redis_cluster import redis_url
from tests.support.redis_server import RedisServer

SHORT_TTL_S = 0.2


@dataclass
class Harness:
    store: LeaseStore
    clock: Clock | None  # the memory store's; None for Redis, which keeps its own time

    async def outlive(self, holder: str, ttl_s: float) -> None:
        """Let `ttl_s` pass: move the clock, or wait (bounded) until Redis drops the key."""
        if self.clock is not None:
            self.clock.advance(ttl_s)
            return
        for _ in range(100):
            if holder not in {lease.holder for lease in await self.store.all()}:
                return
            await asyncio.sleep(ttl_s / 4)
        raise AssertionError(f"lease of {holder!r} did not expire")


@pytest.fixture(params=["memory", "redis", "cluster"])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    if request.param == "memory":
        clock = Clock()
        yield Harness(MemoryLeaseStore(clock), clock)
        return
    url = redis_url(request)  # a redis-server, or a three-node cluster
    store = RedisLeaseStore.from_url(url)
    yield Harness(store, None)
    await store.aclose()


async def test_leases_acquire_is_listed(harness: Harness) -> None:
    """An acquired lease is listed with its MB per GPU and at most its ttl left."""
    await harness.store.acquire("runner-a:llama", {0: 12000, 1: 8000}, 30)
    (lease,) = await harness.store.all()
    assert lease.holder == "runner-a:llama"
    assert dict(lease.gpu_mb) == {0: 12000, 1: 8000}
    assert 0 < lease.ttl_left_s <= 30


async def test_leases_acquire_replaces_the_holders_lease(harness: Harness) -> None:
    """Acquiring again (the measured footprint) replaces the holder's earlier figures."""
    await harness.store.acquire("runner-a:llama", {0: 12000}, 30)
    await harness.store.acquire("runner-a:llama", {0: 9500}, 30)
    (lease,) = await harness.store.all()
    assert dict(lease.gpu_mb) == {0: 9500}


async def test_leases_all_lists_every_holder(harness: Harness) -> None:
    """Other holders' leases (a training job) are listed beside ours, sorted by holder."""
    await harness.store.acquire("training:job-7", {1: 20000}, 30)
    await harness.store.acquire("runner-a:llama", {0: 12000}, 30)
    leases = await harness.store.all()
    assert [lease.holder for lease in leases] == ["runner-a:llama", "training:job-7"]


async def test_leases_release(harness: Harness) -> None:
    """Release drops only that holder's lease; releasing nothing is a no-op."""
    await harness.store.acquire("a", {0: 1000}, 30)
    await harness.store.acquire("b", {0: 2000}, 30)
    await harness.store.release("a")
    await harness.store.release("never-held")
    assert [lease.holder for lease in await harness.store.all()] == ["b"]


async def test_leases_renew_extends(harness: Harness) -> None:
    """Renewing gives the lease the new ttl from now."""
    await harness.store.acquire("a", {0: 1000}, 1)
    await harness.store.renew("a", 60)
    (lease,) = await harness.store.all()
    assert lease.ttl_left_s > 1


async def test_leases_renew_unknown_is_lost(harness: Harness) -> None:
    """Renewing a lease that does not exist raises LeaseLost (503)."""
    with pytest.raises(LeaseLost) as info:
        await harness.store.renew("ghost", 30)
    assert info.value.status == 503


async def test_leases_expire_when_not_renewed(harness: Harness) -> None:
    """A crashed holder's lease disappears after its ttl; others' stay."""
    await harness.store.acquire("crashed", {0: 8000}, SHORT_TTL_S)
    await harness.store.acquire("alive", {0: 1000}, 60)
    await harness.outlive("crashed", SHORT_TTL_S)
    assert [lease.holder for lease in await harness.store.all()] == ["alive"]
    with pytest.raises(LeaseLost):
        await harness.store.renew("crashed", 30)


@pytest.mark.parametrize(
    ("holder", "gpu_mb", "ttl_s"),
    [
        ("", {0: 1}, 30),
        ("a", {}, 30),
        ("a", {0: -1}, 30),
        ("a", {-1: 1}, 30),
        ("a", {0: 1}, 0),
        ("a", {0: 1}, math.nan),
        ("a", {0: 1}, math.inf),
    ],
)
async def test_leases_refuse_bad_input(
    harness: Harness, holder: str, gpu_mb: dict[int, int], ttl_s: float
) -> None:
    """Empty holders, empty or negative leases and non-positive ttls are refused."""
    with pytest.raises(ValueError):
        await harness.store.acquire(holder, gpu_mb, ttl_s)
    assert await harness.store.all() == []


async def test_leases_memory_expire_exactly_at_ttl() -> None:
    """The memory store drops a lease exactly when its ttl has passed on the clock."""
    clock = Clock()
    store = MemoryLeaseStore(clock)
    await store.acquire("a", {0: 1000}, 10)
    clock.advance(9.999)
    assert len(await store.all()) == 1
    clock.advance(0.001)
    assert await store.all() == []


async def test_leases_redis_shared_between_clients(redis_server: RedisServer) -> None:
    """A second client on the same Redis (another replica, a job) sees and drops leases."""
    runner = RedisLeaseStore.from_url(redis_server.url)
    job = RedisLeaseStore.from_url(redis_server.url)
    await job.acquire("training:job-7", {0: 20000}, 30)
    assert [lease.holder for lease in await runner.all()] == ["training:job-7"]
    await job.release("training:job-7")
    assert await runner.all() == []
    await runner.aclose()
    await job.aclose()


async def test_leases_redis_keys_expire_and_stay_in_prefix(redis_server: RedisServer) -> None:
    """Keys carry a TTL in Redis; a store with another prefix (another host) sees none."""
    store = RedisLeaseStore.from_url(redis_server.url)
    other_host = RedisLeaseStore.from_url(redis_server.url, prefix="quorum:mem:lease:host-b:")
    await store.acquire("a", {0: 1000}, 30)
    client = aioredis.Redis.from_url(redis_server.url)
    assert 0 < await client.pttl(store.key("a")) <= 30_000
    assert await other_host.all() == []
    await client.aclose()
    await store.aclose()
    await other_host.aclose()


async def test_leases_redis_skips_unreadable_and_keeps_foreign_without_ttl(
    redis_server: RedisServer,
) -> None:
    """A garbled value is skipped; a lease written without expiry counts, ttl infinite."""
    store = RedisLeaseStore.from_url(redis_server.url)
    client = aioredis.Redis.from_url(redis_server.url)
    await client.set(store.key("garbled"), b"not json")
    await client.set(store.key("forever"), b'{"gpu_mb": {"0": 500}}')
    (lease,) = await store.all()
    assert (lease.holder, dict(lease.gpu_mb), lease.ttl_left_s) == ("forever", {0: 500}, math.inf)
    await client.aclose()
    await store.aclose()


async def test_leases_redis_unreachable_is_unavailable(redis_server: RedisServer) -> None:
    """With Redis stopped, every operation raises LeaseStoreUnavailable (503)."""
    store = RedisLeaseStore.from_url(redis_server.url, timeout_s=1.0)
    await store.acquire("a", {0: 1000}, 30)
    redis_server.stop()
    for call in (
        store.acquire("a", {0: 1000}, 30),
        store.release("a"),
        store.renew("a", 30),
        store.all(),
    ):
        with pytest.raises(LeaseStoreUnavailable) as info:
            await call
        assert info.value.status == 503
    await store.aclose()
