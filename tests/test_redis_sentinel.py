"""Redis Sentinel (REDIS_MODE=sentinel): the URL the settings build, and the stores
following the primary through a failover on real redis-server processes (a primary, a
replica, three sentinels)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from faults.redis_clients import SentinelTarget, parse_sentinel_url, redis_client, sentinel_url
from governance.errors import NonceStoreUnavailable
from governance.nonces import RedisNonceStore
from runner.errors import ConfigError
from runner.floor.settings import load_settings
from tenants.storage import close_storage, storage_from_url
from tests.fixtures.launch import start_fake
from tests.support.poll import eventually
from tests.support.redis_sentinel import SERVICE, ask, running_sentinels, wait_until
from tests.support.runner_proc import start_runner
from tests.support.tokens import DEV_REGISTRY, dev_token

pytestmark = pytest.mark.timeout(90)


def test_redis_sentinel_url_carries_the_base_urls_auth_db_and_tls() -> None:
    """The sentinel URL keeps REDIS_URL's user, password, db and TLS, never its host."""
    url = sentinel_url("10.0.0.1:26379, 10.0.0.2:26379", "main", "rediss://u:p%40ss@x:6379/3")
    assert url.startswith("rediss+sentinel://")
    assert parse_sentinel_url(url) == SentinelTarget(
        (("10.0.0.1", 26379), ("10.0.0.2", 26379)), "main", 3, "u", "p@ss", True
    )
    plain = parse_sentinel_url(sentinel_url("s:1", "svc"))
    assert (plain.db, plain.password, plain.ssl) == (0, None, False)
    with pytest.raises(ValueError):
        sentinel_url("no-port", "svc")


def test_redis_sentinel_settings_build_the_url_or_refuse() -> None:
    """REDIS_MODE=sentinel turns REDIS_SENTINELS into REDIS_URL; without sentinels, or
    with a unix:// REDIS_URL, start-up is refused naming the problem."""
    s = load_settings(
        {"REDIS_MODE": "sentinel", "REDIS_SENTINELS": "a:1,b:2", "REDIS_SENTINEL_SERVICE": "m"}
    )
    assert s.redis_url == "redis+sentinel://a:1,b:2/m/0"
    assert load_settings({"REDIS_URL": "redis://h:1/0"}).redis_url == "redis://h:1/0"
    with pytest.raises(ConfigError, match="REDIS_SENTINELS"):
        load_settings({"REDIS_MODE": "sentinel"})
    with pytest.raises(ConfigError, match="redis:// or rediss://"):
        load_settings(
            {"REDIS_MODE": "sentinel", "REDIS_SENTINELS": "a:1", "REDIS_URL": "unix:///r.sock"}
        )


async def replicated(port: int) -> None:
    """Wait until the replica has every write the primary took so far: a write of our own
    after them, acknowledged by the replica (`WAIT` counts this connection's writes)."""
    direct = aioredis.Redis(port=port)
    await direct.set("quorum-test-fence", b"1")
    assert await direct.execute_command("WAIT", 1, 5000) == 1
    await direct.aclose()


async def _until_served(call: object, timeout: float = 30.0) -> object:
    """Await `call()` until the store answers (it is refused while the sentinels switch)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()  # type: ignore[operator]
        except NonceStoreUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_redis_sentinel_stores_follow_the_primary_through_a_failover() -> None:
    """After the primary is SIGKILLed and the sentinels promote the replica, the same store
    (nonces) and the rate limiter's storage go on against the new primary: a nonce spent
    before the failover (and replicated) stays spent, a new one is accepted."""
    with running_sentinels() as group:
        store = RedisNonceStore(redis_client(group.url, 1.0))
        limiter = storage_from_url(group.url, timeout_s=1.0)
        assert await store.consume("nonce-before-failover-aaaa", 300)
        assert await limiter.incr("quorum-test-window", 60) == 1
        await replicated(group.primary_port)
        group.kill(group.primary_port)
        wait_until(lambda: group.primary() == group.replica_port, "failover", timeout=60)
        replay = await _until_served(lambda: store.consume("nonce-before-failover-aaaa", 300))
        assert replay is False
        assert await store.consume("nonce-after-failover-aaaaa", 300) is True
        assert await limiter.incr("quorum-test-window", 60) == 2
        assert b"role:master" in ask(group.replica_port, "INFO", "replication")
        await store.aclose()
        await close_storage(limiter)


def test_redis_sentinel_runner_keeps_a_spent_token_spent_through_a_failover() -> None:
    """A runner with REDIS_MODE=sentinel: a cache-flush token answers 200, the primary is
    SIGKILLed (its writes replicated), the sentinels promote the replica, and the runner,
    unrestarted, answers the replay 409 and a new token 200 from the new primary (503
    `nonce_store_unavailable` while it switches)."""
    with (
        running_sentinels() as group,
        start_fake("fake_openai", "--latency-ms", "0") as engine,
        start_runner(
            {"echo": engine.url},
            env={
                "REDIS_MODE": "sentinel",
                "REDIS_SENTINELS": group.sentinels,
                "REDIS_SENTINEL_SERVICE": SERVICE,
                "GOVERNANCE_REGISTRY": str(DEV_REGISTRY),
            },
        ) as runner,
    ):
        token = dev_token("cache-flush", None, {"scope": "all"})
        assert flush(runner.url, token).status_code == 200
        asyncio.run(replicated(group.primary_port))
        group.kill(group.primary_port)
        wait_until(lambda: group.primary() == group.replica_port, "failover", timeout=60)
        codes = replays_until_served(runner.url, token)
        assert codes[-1] == 409 and set(codes) <= {503, 409}
        fresh = dev_token("cache-flush", None, {"scope": "all"})
        assert flush(runner.url, fresh).status_code == 200


def replays_until_served(url: str, token: dict[str, Any], timeout: float = 30.0) -> list[int]:
    """Replay `token` until the answer is not 503 (the switch); every status seen."""
    codes: list[int] = []

    def served() -> bool:
        codes.append(flush(url, token).status_code)
        return codes[-1] != 503

    eventually(served, timeout)
    return codes


def flush(url: str, token: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + "/v1/cache/flush", json={"scope": "all", "verifiedOpToken": token},
                      timeout=20)  # fmt: skip
