"""The data path's HTTP/1.1 engine client (adapters/http_client.py) against real fake engines."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import orjson
import pytest

from adapters.http_client import (
    ConnectFailed,
    ConnectionDropped,
    EngineConnections,
    ResponseTimeout,
)
from tests.fixtures.launch import FakeEngine, start_fake

CHAT = orjson.dumps({"model": "echo", "messages": [{"role": "user", "content": "hi"}]})
STREAM = orjson.dumps(
    {"model": "echo", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
)


@pytest.fixture(scope="module")
def echo() -> Iterator[FakeEngine]:
    with start_fake(
        "fake_openai", "--latency-ms", "0", "--chunks", "4", "--chunk-delay-ms", "2"
    ) as engine:
        yield engine


async def test_pool_reuses_keep_alive_connection(echo: FakeEngine) -> None:
    """Sequential requests share one connection."""
    pool = EngineConnections(echo.url, 5, 5)
    for _ in range(3):
        async with await pool.post("/v1/chat/completions", CHAT) as resp:
            assert resp.status == 200
            assert orjson.loads(await resp.read())["object"] == "chat.completion"
    assert len(pool._all) == 1
    pool.close()


async def test_pool_streams_each_engine_write_as_a_chunk(echo: FakeEngine) -> None:
    """A streamed body is handed on chunk by chunk, as the engine wrote it."""
    pool = EngineConnections(echo.url, 5, 5)
    resp = await pool.post("/v1/chat/completions", STREAM)
    chunks = [c async for c in resp.chunks()]
    resp.release()
    tokens = [c for c in chunks if b'"tok' in c]
    assert len(tokens) == 4 and all(c.count(b'"tok') == 1 for c in tokens)
    assert chunks[-1].endswith(b"data: [DONE]\n\n")
    pool.close()


async def test_pool_concurrent_requests_open_parallel_connections(echo: FakeEngine) -> None:
    """Concurrent requests each get their own connection, later reused."""
    pool = EngineConnections(echo.url, 5, 5)

    async def one() -> int:
        async with await pool.post("/v1/chat/completions", CHAT) as resp:
            await resp.read()
            return resp.status

    assert await asyncio.gather(*(one() for _ in range(8))) == [200] * 8
    opened = len(pool._all)
    assert await asyncio.gather(*(one() for _ in range(8))) == [200] * 8
    assert len(pool._all) == opened
    pool.close()


async def test_pool_retries_once_when_idle_connection_was_closed(echo: FakeEngine) -> None:
    """A kept-alive connection the engine closed meanwhile is replaced transparently."""
    pool = EngineConnections(echo.url, 5, 5)
    async with await pool.post("/v1/chat/completions", CHAT) as resp:
        await resp.read()
    idle = pool._idle[0]
    assert idle.transport is not None
    idle.transport.get_extra_info("socket").shutdown(socket.SHUT_RD)  # looks open, is dead
    async with await pool.post("/v1/chat/completions", CHAT) as resp:
        assert resp.status == 200
    pool.close()


async def test_pool_connect_refused_raises_connect_failed() -> None:
    """Nothing listening: ConnectFailed, at once."""
    with start_fake("fake_refuses") as engine:
        pool = EngineConnections(engine.url, 5, 5)
        with pytest.raises(ConnectFailed):
            await pool.post("/v1/chat/completions", CHAT)


async def test_pool_hang_raises_response_timeout() -> None:
    """An engine that never answers raises ResponseTimeout after the read timeout."""
    with start_fake("fake_hangs") as engine:
        pool = EngineConnections(engine.url, 5, 0.3)
        with pytest.raises(ResponseTimeout):
            await pool.post("/v1/chat/completions", CHAT)
        assert not pool._all  # the stuck connection is not kept
        pool.close()


async def test_pool_read_timeout_is_per_wait_not_per_answer() -> None:
    """The read timeout bounds each silence, not the whole answer: a stream slower in
    total than the timeout, each chunk within it, is read whole, twice on one connection
    (the connection's one timer moves on from deadline to deadline)."""
    with start_fake(
        "fake_openai", "--latency-ms", "0", "--chunks", "8", "--chunk-delay-ms", "200"
    ) as engine:
        pool = EngineConnections(engine.url, 5, 1.2)  # 6x a chunk's gap, under a stream's 1.6 s
        for _ in range(2):
            resp = await pool.post("/v1/chat/completions", STREAM)
            chunks = [c async for c in resp.chunks()]
            resp.release()
            assert sum(c.count(b'"tok') for c in chunks) == 8
        assert len(pool._all) == 1
        pool.close()


async def test_pool_dropped_midstream_raises_connection_dropped() -> None:
    """An engine that cuts a stream raises ConnectionDropped after the chunks it sent."""
    with start_fake(
        "fake_dies_midstream", "--after", "2", "--how", "abort", "--chunk-delay-ms", "0"
    ) as engine:
        pool = EngineConnections(engine.url, 5, 5)
        resp = await pool.post("/v1/chat/completions", STREAM)
        got: list[bytes] = []
        with pytest.raises(ConnectionDropped):
            async for chunk in resp.chunks():
                got.append(chunk)
        resp.release()
        assert sum(c.count(b'"tok') for c in got) == 2
        assert not pool._idle
        pool.close()


def test_pool_rejects_non_http_url() -> None:
    """Only plain http:// engine URLs are accepted."""
    with pytest.raises(ValueError):
        EngineConnections("https://x:1", 1, 1)
