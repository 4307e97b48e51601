"""The `store` fixture: every test that takes it runs on the memory store, the SQLite store
and a real Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from runner.jobs.sqlite_store import SqliteJobStore
from runner.jobs.store import JobStore, MemoryJobStore, RedisJobStore
from tests.runner.jobs.support import Clock
from tests.support.redis_cluster import redis_url


@pytest.fixture(params=["memory", "sqlite", "redis", "cluster"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[JobStore]:
    if request.param == "memory":
        yield MemoryJobStore(Clock())
        return
    if request.param == "sqlite":
        kept = SqliteJobStore(tmp_path / "state.sqlite3", Clock())
        yield kept
        await kept.aclose()
        return
    url = redis_url(request)  # a redis-server, or a three-node cluster
    redis_store = RedisJobStore.from_url(url)
    yield redis_store
    await redis_store.aclose()
