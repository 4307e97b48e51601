"""How every Redis client of the stores connects (nonces, rate windows, load tasks, jobs,
memory leases), in one place, so that all of them come back alike after Redis restarts.

A restarted Redis leaves each connection a client kept in its pool dead, and redis-py's
`from_url` clients do not retry: the first command on each would fail (a 503 answered,
a write lost) although Redis is back. So a command whose connection turns out closed
(`ConnectionError`) is sent once more, at once, on a new connection. A timeout is never
retried: the command may have run, and running a rate-limit hit or a nonce twice would
count it twice.
"""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError


def reconnecting_retry() -> Retry:
    """One more try, on a new connection, when the connection was found closed."""
    return Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))


def redis_client(url: str, timeout_s: float) -> aioredis.Redis:
    """A client for `url` (`REDIS_URL`) whose connect and commands time out after
    `timeout_s` (a hung Redis answers 503 fast), retried once on a closed connection."""
    return aioredis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=reconnecting_retry(),
    )


def redis_pool(url: str, timeout_s: float) -> aioredis.ConnectionPool:
    """The same settings as `redis_client`, as a pool (for a library that takes one)."""
    return aioredis.ConnectionPool.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=reconnecting_retry(),
    )
