"""NONCE_REPLICAS: a spent nonce (and a tenant policy change) is trusted only once a
replica acknowledged it (Redis WAIT on the connection that wrote it), on real
redis-server processes: a primary, a replica and three sentinels, the replica cut off
(SIGSTOP until the primary drops it) before the primary is SIGKILLed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import httpx
import pytest

from faults.redis_clients import redis_client
from faults.redis_wait import ReplicasSetting
from governance.errors import NonceNotReplicated, NonceStoreUnavailable
from governance.nonces import RedisNonceStore
from tenants.policy_store import PolicyNotReplicated, RedisPolicyStore
from tests.fixtures.launch import start_fake
from tests.support.redis_sentinel import running_replica, running_sentinels
from tests.support.redis_server import RedisServer
from tests.support.runner_proc import start_runner
from tests.support.tokens import DEV_REGISTRY, dev_token
from tests.test_redis_sentinel import replicated

pytestmark = pytest.mark.timeout(150)

BEFORE = "nonce-acked-before-the-cut-aaaa"
DURING = "nonce-spent-while-cut-off-aaaaa"


async def _until_served(call: Callable[[], Awaitable[bool]], timeout: float = 60.0) -> bool:
    """Await `call()` until the store answers (refused while the sentinels switch, or
    while a replica just attached is slow to acknowledge)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except NonceStoreUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _spend(store: RedisNonceStore, nonce: str) -> bool:
    """True: accepted (the operation runs); False: a replay; NonceNotReplicated: refused,
    the operation does not run (counted as not performed)."""
    try:
        return await store.consume(nonce, 300)
    except NonceNotReplicated:
        return False


@pytest.mark.parametrize(
    "replicas",
    [
        1,
        "auto",
        pytest.param(
            0,
            marks=pytest.mark.xfail(
                strict=True, reason="WAIT off: the promoted replica never got the spend"
            ),
        ),
    ],
)
async def test_redis_wait_no_nonce_is_accepted_twice_across_a_failover(
    replicas: ReplicasSetting,
) -> None:
    """A nonce spent while the replica is cut off, then the primary SIGKILLed and the
    replica promoted: with NONCE_REPLICAS=1 or auto (the default) each nonce is accepted
    at most once across the failover (the cut-off spend is refused, then accepted once on
    the new primary when a replica acknowledges it; an acknowledged one stays spent); with
    WAIT off the cut-off spend is accepted twice."""
    with running_sentinels() as group:
        store = RedisNonceStore(redis_client(group.url, 3.0), replicas=replicas, timeout_ms=300)
        accepted = {BEFORE: 0, DURING: 0}
        accepted[BEFORE] += await _spend(store, BEFORE)
        await replicated(group.primary_port)
        group.cut_off_replica()
        accepted[DURING] += await _spend(store, DURING)
        group.fail_over_to_the_cut_off_replica()
        with running_replica(group.replica_port):  # the new primary's replica
            for nonce in (BEFORE, DURING):
                # a refused spend (not acknowledged in time) is released: sent again
                accepted[nonce] += await _until_served(partial(store.consume, nonce, 300))
        await store.aclose()
    assert accepted == {BEFORE: 1, DURING: 1}


async def test_redis_wait_short_releases_the_nonce_for_the_same_token(
    redis_server: RedisServer,
) -> None:
    """No replica to acknowledge: the spend is refused (NonceNotReplicated, 503
    nonce_store_unavailable) and released, so the same nonce is accepted once a replica
    acknowledges it; a replayed one is still a replay."""
    store = RedisNonceStore.from_url(redis_server.url, replicas=1, timeout_ms=3000)
    with pytest.raises(NonceNotReplicated) as refused:
        await store.consume(DURING, 300)
    assert refused.value.status == 503 and refused.value.code == "nonce_store_unavailable"
    assert "released" in str(refused.value)
    with running_replica(redis_server.port):
        assert await store.consume(DURING, 300) is True
        assert await store.consume(DURING, 300) is False
    await store.aclose()


async def test_redis_wait_policy_change_unacknowledged_is_reported(
    redis_server: RedisServer,
) -> None:
    """A tenant policy change no replica acknowledged raises PolicyNotReplicated (it is on
    the primary, a failover may undo it); with a replica attached it is acknowledged."""
    store = RedisPolicyStore.from_url(redis_server.url, replicas=1, timeout_ms=100)
    with pytest.raises(PolicyNotReplicated):
        await store.put("acme", {"keys": []}, "0" * 64, ("admin1",), 1.0)
    await store.aclose()
    # WAIT answers once the replica acknowledges: a long bound costs nothing when it does,
    # and a busy machine may take more than 100 ms to
    store = RedisPolicyStore.from_url(redis_server.url, replicas=1, timeout_ms=10_000)
    with running_replica(redis_server.port):
        record = await store.put("acme", None, "1" * 64, ("admin1",), 2.0)
    assert record.version == 2 and record.policy is None
    assert (await store.snapshot())[0] == 2
    await store.aclose()


def test_redis_wait_runner_refuses_an_unacknowledged_spend_then_takes_the_same_token(
    redis_server: RedisServer,
) -> None:
    """A runner with NONCE_REPLICAS=1 on a Redis without a replica answers a lifecycle
    call 503 nonce_store_unavailable (nothing flushed); once a replica is attached the
    same token answers 200, and its replay 409."""
    env = {
        "REDIS_URL": redis_server.url,
        "NONCE_REPLICAS": "1",
        "NONCE_REPLICAS_TIMEOUT_MS": "3000",  # acknowledged well within it, busy or not
        "GOVERNANCE_REGISTRY": str(DEV_REGISTRY),
    }
    with (
        start_fake("fake_openai", "--latency-ms", "0") as engine,
        start_runner({"echo": engine.url}, env=env) as runner,
    ):
        token = dev_token("cache-flush", None, {"scope": "all"})
        refused = _flush(runner.url, token)
        assert refused.status_code == 503
        error = refused.json()["error"]
        assert error["code"] == "nonce_store_unavailable"
        assert (error["replicasAcked"], error["replicasAsked"]) == (0, 1)
        with running_replica(redis_server.port):
            assert _flush(runner.url, token).status_code == 200
            assert _flush(runner.url, token).status_code == 409


def _flush(url: str, token: dict[str, Any]) -> httpx.Response:
    body = {"scope": "all", "verifiedOpToken": token}
    return httpx.post(url + "/v1/cache/flush", json=body, timeout=20)
