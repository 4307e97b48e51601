"""Every Redis store answers its first command after Redis restarted, and a command that
timed out is not sent twice (`faults/redis_clients.py`), on a real redis-server."""

from __future__ import annotations

import socket
import threading
from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from faults.redis_clients import redis_client, redis_pool
from governance.nonces import RedisNonceStore
from runner.jobs.store import RedisJobStore
from runner.memory.leases import RedisLeaseStore
from runner.tasks.redis_store import RedisTaskStore
from tenants.storage import SharedRedisStorage, close_storage, storage_from_url
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.timeout(60)

Use = Callable[[], Awaitable[object]]


def _nonces(url: str) -> tuple[Use, Callable[[], Awaitable[None]]]:
    store = RedisNonceStore.from_url(url)
    count = iter(range(1000))
    return (lambda: store.consume(f"nonce-{next(count):04d}-" + "a" * 20, 60)), store.aclose


def _tasks(url: str) -> tuple[Use, Callable[[], Awaitable[None]]]:
    store = RedisTaskStore.from_url(url)
    return (lambda: store.get("load-" + "0" * 32)), store.aclose


def _jobs(url: str) -> tuple[Use, Callable[[], Awaitable[None]]]:
    store = RedisJobStore.from_url(url)
    return (lambda: store.get("job_" + "0" * 32)), store.aclose


def _leases(url: str) -> tuple[Use, Callable[[], Awaitable[None]]]:
    store = RedisLeaseStore.from_url(url)
    return (lambda: store.acquire("runner-a/m", {0: 64}, 30)), store.aclose


def _windows(url: str) -> tuple[Use, Callable[[], Awaitable[None]]]:
    storage = storage_from_url(url)
    assert isinstance(storage, SharedRedisStorage)
    return (lambda: storage.acquire_and_read("quorum-test", 100, 60)), lambda: close_storage(
        storage
    )


@pytest.mark.parametrize("make", [_nonces, _tasks, _jobs, _leases, _windows])
async def test_store_first_command_after_redis_restart_succeeds(
    redis_server: RedisServer, make: Callable[[str], tuple[Use, Callable[[], Awaitable[None]]]]
) -> None:
    """A store whose pooled connection a Redis restart closed answers its next command
    (sent again on a new connection) instead of failing it."""
    use, close = make(redis_server.url)
    try:
        await use()
        redis_server.stop()
        redis_server.start()
        await use()
    finally:
        await close()


class SilentServer:
    """A server that answers +OK to a client's connection set-up but never to INCR;
    `received()` stops it and returns every byte each connection sent."""

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen()
        self._listener.settimeout(0.1)
        self.port: int = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._chunks: list[bytes] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(0.1)
        with conn:
            while not self._stop.is_set():
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    continue
                if not chunk:
                    return
                self._chunks.append(chunk)
                if b"INCR" not in chunk:  # CLIENT SETINFO and the like: one +OK each
                    conn.sendall(b"+OK\r\n" * chunk.count(b"*"))

    def received(self) -> bytes:
        self._stop.set()
        for thread in list(self._threads):
            thread.join(5)
        self._listener.close()
        return b"".join(self._chunks)


async def test_redis_client_timed_out_command_is_not_sent_again() -> None:
    """A command that timed out may have run: it is not sent a second time (a rate-limit
    hit or a nonce would count twice)."""
    server = SilentServer()
    client: aioredis.Redis = redis_client(f"redis://127.0.0.1:{server.port}/0", 0.3)
    try:
        with pytest.raises(RedisTimeoutError):
            await client.incr("quorum-counter")
    finally:
        await client.aclose()
        sent = server.received()
    assert sent.count(b"INCR") == 1


@pytest.mark.parametrize(
    "broken", [AttributeError("writelines"), RuntimeError("unable to perform operation")]
)
async def test_sentinel_pool_broken_sentinel_connection_is_a_connection_error(
    broken: Exception,
) -> None:
    """redis-py's internal errors while asking the sentinels (a sentinel connection closed
    under a concurrent command) come out as a Redis ConnectionError, which every store
    takes for Redis being away (503), never as a 500."""
    pool = redis_pool("redis+sentinel://127.0.0.1:1/quorum/0", 0.2)

    async def discover(service: str) -> tuple[str, int]:
        raise broken

    pool.sentinel_manager.discover_master = discover  # type: ignore[attr-defined]
    with pytest.raises(RedisConnectionError):
        await pool.get_master_address()  # type: ignore[attr-defined]
    await pool.disconnect()
