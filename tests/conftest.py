"""Shared fixtures: a real Redis per test that asks for one; the artefacts kept, listed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.redis_server import RedisServer, running_redis


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh redis-server on a free port, stopped after the test."""
    with running_redis() as server:
        yield server


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name the artefacts (screenshots) this session kept, so CI logs show where they are."""
    from tests.support.artefacts import KEPT

    for path in KEPT:
        if path.exists():
            terminalreporter.write_line(f"artefact kept: {path}")
