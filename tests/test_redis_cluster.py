"""Redis Cluster (REDIS_MODE=cluster): the URL the settings build, the stores the shared
suites do not cover (permits, policy notifications, WAIT routed to the key's node), and
two runners on a real three-primary cluster. The shared store suites (nonces, limiter
windows, budgets, policies, leases, tasks, jobs) run on the same cluster through their
"cluster" parameter."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from faults.redis_clients import (
    ClusterTarget,
    cluster_url,
    one_slot,
    parse_cluster_url,
    ready,
    redis_client,
)
from governance.errors import NonceNotReplicated
from governance.nonces import RedisNonceStore
from runner.errors import ConfigError
from runner.floor.settings import load_settings
from tenants.permit_store import RedisPermitStore
from tenants.policy_store import RedisPolicyStore
from tests.support.engines import GOVERNED
from tests.support.fleet import entry, loaded
from tests.support.poll import eventually
from tests.support.redis_cluster import RedisClusterGroup
from tests.support.runner_proc import start_runner, wait_started
from tests.support.tokens import dev_token

pytestmark = pytest.mark.timeout(120)


def test_redis_cluster_url_from_redis_url_and_nodes() -> None:
    """The cluster URL keeps REDIS_URL's node, user, password and TLS and adds
    REDIS_CLUSTER_NODES; a db other than 0 or no node at all is refused."""
    url = cluster_url("rediss://u:p%40ss@10.0.0.1:7000/0", "10.0.0.2:7001, 10.0.0.3:7002")
    assert url.startswith("rediss+cluster://")
    assert parse_cluster_url(url) == ClusterTarget(
        (("10.0.0.1", 7000), ("10.0.0.2", 7001), ("10.0.0.3", 7002)), "u", "p@ss", True
    )
    assert parse_cluster_url(cluster_url(None, "h:1")).nodes == (("h", 1),)
    with pytest.raises(ValueError, match="db 0"):
        cluster_url("redis://h:1/3")
    with pytest.raises(ValueError, match="no cluster node"):
        cluster_url(None, "")


def test_redis_cluster_settings_build_the_url_or_refuse() -> None:
    """REDIS_MODE=cluster turns REDIS_URL (any node) and REDIS_CLUSTER_NODES into
    REDIS_URL; with neither, or a unix:// REDIS_URL, start-up is refused."""
    s = load_settings({"REDIS_MODE": "cluster", "REDIS_URL": "redis://n1:7000/0"})
    assert s.redis_url == "redis+cluster://n1:7000/0" and s.redis_mode == "cluster"
    nodes = load_settings({"REDIS_MODE": "cluster", "REDIS_CLUSTER_NODES": "a:1,b:2"})
    assert nodes.redis_url == "redis+cluster://a:1,b:2/0"
    with pytest.raises(ConfigError, match="REDIS_CLUSTER_NODES"):
        load_settings({"REDIS_MODE": "cluster"})
    with pytest.raises(ConfigError, match="redis:// or rediss://"):
        load_settings({"REDIS_MODE": "cluster", "REDIS_URL": "unix:///r.sock"})


def test_redis_cluster_one_slot_prefixes_only_on_a_cluster() -> None:
    """Fleet-wide prefixes get a hash tag on a cluster URL only (a Redis in use keeps its
    key names)."""
    assert one_slot("redis+cluster://h:1/0", "quorum:task:") == "{quorum:task}:"
    assert one_slot("redis://h:1/0", "quorum:task:") == "quorum:task:"
    assert one_slot("redis+cluster://h:1/0", "{x}:") == "{x}:"


async def test_redis_cluster_permits_cap_release_and_announce(
    redis_cluster: RedisClusterGroup,
) -> None:
    """A tenant's shared in-flight cap on the cluster: two permits of two, a third
    refused; a release frees one and is announced on the freed channel (pub/sub)."""
    store = RedisPermitStore.from_url(redis_cluster.url)
    subscriber = redis_client(redis_cluster.url, 5.0)
    await ready(subscriber)
    listener = subscriber.pubsub()
    await listener.subscribe("quorum:inflight:freed")
    assert [await store.acquire("acme", 2, f"r:{i}", 30) for i in range(3)] == [1, 1, 0]
    await store.renew("acme", ["r:0", "r:1"], 30)
    await store.release("acme", "r:0")
    assert await store.held("acme") == 1
    message = await _message(listener)
    assert message["data"] == b"acme"
    await listener.aclose()
    await subscriber.aclose()
    await store.aclose()


async def _message(pubsub: Any) -> dict[str, Any]:
    """The next published message (subscribe confirmations skipped), within 10 s."""
    async with asyncio.timeout(10):
        while True:
            got = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if got is not None:
                return dict(got)


async def test_redis_cluster_policy_change_notifies_other_replicas(
    redis_cluster: RedisClusterGroup,
) -> None:
    """A policy written on the cluster (one script over two hash-tagged keys) is read by
    another store, which its `listen` loop is told about."""
    writer = RedisPolicyStore.from_url(redis_cluster.url)
    reader = RedisPolicyStore.from_url(redis_cluster.url)
    told = asyncio.Event()

    async def changed() -> None:
        if (await reader.snapshot())[0] >= 1:
            told.set()

    listening = asyncio.create_task(reader.listen(changed))
    await asyncio.sleep(0)  # let it subscribe before the change (it also reads at start)
    await writer.put("acme", {"keys": []}, "0" * 64, ("admin1",), 1.0)
    async with asyncio.timeout(10):
        await told.wait()
    listening.cancel()
    assert (await reader.snapshot())[1]["acme"].version == 1
    for store in (writer, reader):
        await store.aclose()


async def test_redis_cluster_wait_goes_to_the_keys_node(redis_cluster: RedisClusterGroup) -> None:
    """NONCE_REPLICAS=1 on a cluster whose primaries have no replica: the spend is sent with
    its WAIT to the key's own node (no CROSSSLOT, no error), refused and released."""
    store = RedisNonceStore.from_url(redis_cluster.url, replicas=1, timeout_ms=100)
    for nonce in ("nonce-cluster-wait-aaaaaaaaa", "nonce-cluster-wait-bbbbbbbbb"):
        with pytest.raises(NonceNotReplicated, match="released"):
            await store.consume(nonce, 60)
    await store.aclose()


def test_redis_cluster_two_runners_share_nonces_limits_and_tasks(
    redis_cluster: RedisClusterGroup,
) -> None:
    """Two runners with REDIS_MODE=cluster (one names node 1, the other node 2): a rate
    window is shared, a load task started on one is read from the other, a spent token
    is refused on a replay (409)."""
    models = "models:\n" + entry("m", "llama-server-ok", preload=True)
    models += entry("quick", "llama-server-ok")
    base = {**GOVERNED, "REDIS_MODE": "cluster", "TENANT_RATE_LIMIT_metered": "3req/day"}
    nodes = [f"redis://127.0.0.1:{port}/0" for port in redis_cluster.ports]
    env_a = {**base, "RUNNER_ID": "a", "REDIS_URL": nodes[1]}
    env_b = {**base, "RUNNER_ID": "b", "REDIS_URL": nodes[2]}
    with (
        start_runner(models_file=models, env=env_a, wait_ready=False) as a,
        start_runner(models_file=models, env=env_b, wait_ready=False) as b,
    ):
        for runner in (a, b):
            wait_started(runner, timeout=60)
            eventually(lambda r=runner: "m" in loaded(r), timeout=60)  # type: ignore[misc]
        codes = [_chat(url, "metered") for url in (a.url, b.url, a.url, b.url)]
        assert codes == [200, 200, 200, 429]
        token = dev_token("model-load", "quick", {}, aud="a")
        started = _load(a.url, token)
        assert started.status_code == 202, started.text
        task = httpx.get(f"{b.url}/v1/models/load/{started.json()['taskId']}", timeout=10)
        assert task.status_code == 200 and task.json()["modelId"] == "quick"
        assert _load(a.url, token).status_code == 409


def _chat(url: str, tenant: str) -> int:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    answer = httpx.post(
        url + "/v1/chat/completions", json=body, headers={"X-Tenant-ID": tenant}, timeout=30
    )
    return answer.status_code


def _load(url: str, token: dict[str, Any]) -> httpx.Response:
    body = {"modelId": "quick", "verifiedOpToken": token}
    return httpx.post(url + "/v1/models/load", json=body, timeout=30)
