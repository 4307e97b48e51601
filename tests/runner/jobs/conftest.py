"""The `store` fixture: every test that takes it runs on the memory store and on a real Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from runner.jobs.store import JobStore, MemoryJobStore, RedisJobStore
from tests.runner.jobs.support import Clock
from tests.support.redis_server import RedisServer


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[JobStore]:
    if request.param == "memory":
        yield MemoryJobStore(Clock())
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    redis_store = RedisJobStore.from_url(server.url)
    yield redis_store
    await redis_store.aclose()
