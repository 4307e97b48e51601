"""The governed tenant policy stores, memory, SQLite and a real Redis, through one suite."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tenants.policy_store import (
    MemoryPolicyStore,
    PolicyStore,
    PolicyStoreUnavailable,
    RedisPolicyStore,
    SqlitePolicyStore,
)
from tests.support.redis_cluster import redis_url

pytestmark = pytest.mark.timeout(30)

NOW = 1_767_225_630.0
POLICY = {"api_keys": ["sha256:" + "a" * 64], "models": ["echo"]}


@pytest.fixture(params=["memory", "sqlite", "redis", "cluster"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[PolicyStore]:
    made: PolicyStore
    if request.param == "memory":
        made = MemoryPolicyStore()
    elif request.param == "sqlite":
        made = SqlitePolicyStore(tmp_path / "state.sqlite3")
    else:
        url = redis_url(request)  # a redis-server, or a three-node cluster
        made = RedisPolicyStore.from_url(url)
    yield made
    await made.aclose()


async def test_policy_store_starts_empty(store: PolicyStore) -> None:
    """A new store has version 0 and no governed policy."""
    assert await store.snapshot() == (0, {})


async def test_policy_store_versions_grow_and_last_write_wins(store: PolicyStore) -> None:
    """Each change gets the next version; a tenant's record is its last change, as put."""
    first = await store.put("acme", POLICY, "s1", ("admin1", "admin2"), NOW)
    second = await store.put("globex", None, "s2", ("admin1",), NOW + 1)
    third = await store.put("acme", {"models": ["other"]}, "s3", ("admin2",), NOW + 2)
    assert (first.version, second.version, third.version) == (1, 2, 3)
    version, records = await store.snapshot()
    assert version == 3
    assert records["acme"] == third
    assert records["globex"].policy is None and records["globex"].approved_by == ("admin1",)


async def test_sqlite_policy_store_keeps_records_across_a_reopen(tmp_path: Path) -> None:
    """A store opened again on the same file (a restart) reads every record and version,
    and the next change continues the versions."""
    path = tmp_path / "state.sqlite3"
    first = SqlitePolicyStore(path)
    kept = await first.put("acme", POLICY, "s1", ("admin1", "admin2"), NOW)
    await first.put("globex", None, "s2", ("admin1",), NOW)
    await first.aclose()
    second = SqlitePolicyStore(path)
    version, records = await second.snapshot()
    assert version == 2 and records["acme"] == kept and records["globex"].policy is None
    assert (await second.put("acme", None, "s3", (), NOW)).version == 3
    await second.aclose()


async def test_sqlite_policy_store_failure_is_unavailable(tmp_path: Path) -> None:
    """A store whose file can no longer be used raises PolicyStoreUnavailable."""
    store = SqlitePolicyStore(tmp_path / "state.sqlite3")
    await store.aclose()
    with pytest.raises(PolicyStoreUnavailable):
        await store.snapshot()
