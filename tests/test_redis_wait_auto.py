"""NONCE_REPLICAS=auto (the default): a spent nonce waits for a replica where the Redis
primary has one and for none where it has none, on real redis-server processes."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from faults.redis_wait import AutoReplicas
from tests.fixtures.launch import start_fake
from tests.support.redis_sentinel import ask, running_replica, wait_until
from tests.support.redis_server import RedisServer
from tests.support.runner_proc import start_runner
from tests.support.tokens import DEV_REGISTRY, dev_token

pytestmark = pytest.mark.timeout(120)


def test_auto_replicas_asks_one_where_the_primary_has_had_a_replica() -> None:
    """0 for a primary without replicas; 1 once it has had one, still 1 when it drops it;
    a new primary (a new replication id) is judged afresh."""
    auto = AutoReplicas()
    assert auto.asked({"master_replid": "a", "connected_slaves": 0}) == 0
    assert auto.asked({"master_replid": "a", "connected_slaves": 2}) == 1
    assert auto.asked({"master_replid": "a", "connected_slaves": 0}) == 1
    assert auto.asked({"master_replid": "b", "connected_slaves": 0}) == 0
    assert auto.asked({}) == 0


def test_auto_replicas_forgets_old_primaries() -> None:
    """Only the last primaries seen are remembered (a long life of failovers stays small)."""
    auto = AutoReplicas()
    for n in range(100):
        auto.asked({"master_replid": str(n), "connected_slaves": 1})
    assert len(auto.seen) <= 16 and auto.asked({"master_replid": "99"}) == 1


def _flush(url: str, token: dict[str, Any]) -> httpx.Response:
    body = {"scope": "all", "verifiedOpToken": token}
    return httpx.post(url + "/v1/cache/flush", json=body, timeout=20)


def _runner_env(redis: RedisServer) -> dict[str, str]:
    """NONCE_REPLICAS unset: the default."""
    return {
        "REDIS_URL": redis.url,
        "NONCE_REPLICAS_TIMEOUT_MS": "3000",  # acknowledged well within it, busy or not
        "GOVERNANCE_REGISTRY": str(DEV_REGISTRY),
    }


def test_nonce_replicas_default_spends_on_a_lone_redis(redis_server: RedisServer) -> None:
    """A lone Redis (no replica) with NONCE_REPLICAS unset: a lifecycle token answers 200,
    its replay 409 (nothing waits for a replica that does not exist)."""
    with (
        start_fake("fake_openai", "--latency-ms", "0") as engine,
        start_runner({"echo": engine.url}, env=_runner_env(redis_server)) as runner,
    ):
        token = dev_token("cache-flush", None, {"scope": "all"})
        assert _flush(runner.url, token).status_code == 200
        assert _flush(runner.url, token).status_code == 409


def test_nonce_replicas_default_waits_where_the_primary_has_a_replica(
    redis_server: RedisServer,
) -> None:
    """NONCE_REPLICAS unset, the primary with a replica: a token answers 200 (acknowledged);
    once the replica is gone a new token answers 503 nonce_store_unavailable (asked 1,
    acked 0: WAIT was used), and the same token answers 200 when a replica is back."""
    with (
        start_fake("fake_openai", "--latency-ms", "0") as engine,
        start_runner({"echo": engine.url}, env=_runner_env(redis_server)) as runner,
    ):
        with running_replica(redis_server.port):
            first = dev_token("cache-flush", None, {"scope": "all"})
            assert _flush(runner.url, first).status_code == 200
        wait_until(
            lambda: b"connected_slaves:0" in ask(redis_server.port, "INFO", "replication"),
            "the primary saw its replica go",
        )
        token = dev_token("cache-flush", None, {"scope": "all"})
        refused = _flush(runner.url, token)
        assert refused.status_code == 503
        error = refused.json()["error"]
        assert error["code"] == "nonce_store_unavailable"
        assert (error["replicasAcked"], error["replicasAsked"]) == (0, 1)
        with running_replica(redis_server.port):
            assert _flush(runner.url, token).status_code == 200
