"""Shared fixtures: a real Redis per test that asks for one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.redis_server import RedisServer, running_redis


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh redis-server on a free port, stopped after the test."""
    with running_redis() as server:
        yield server
