"""Build the rate-limit store: in-process memory, or Redis shared by every replica."""

from __future__ import annotations

import time

from limits.aio.storage import RedisStorage, Storage
from redis.asyncio import ConnectionPool

from tenants.errors import InvalidTenantConfig
from tenants.memory_store import Clock, MemoryWindowStorage

KEY_PREFIX = "quorum"
"""Every rate-limit key in Redis starts with `quorum:`."""

_SCHEMES = {
    "redis://": "async+redis://",
    "rediss://": "async+rediss://",
    "unix://": "async+redis+unix://",
}


def storage_from_url(
    redis_url: str | None,
    *,
    clock: Clock = time.time,
    timeout_s: float = 0.25,
) -> Storage:
    """`MemoryWindowStorage(clock)` when `redis_url` is empty, else the `limits` library's
    async `RedisStorage` (redis-py client, keys prefixed `quorum`).

    `redis_url` is what `REDIS_URL` holds: `redis://`, `rediss://` or `unix://` (the
    library's own `async+redis://` spellings are accepted too). Connect and command time
    out after `timeout_s`, so a hung Redis fails a request fast instead of holding it.
    Redis windows run on Redis' clock (key TTLs), not on `clock`.
    """
    if not redis_url:
        return MemoryWindowStorage(clock)
    uri = redis_url
    for plain, scheme in _SCHEMES.items():
        if redis_url.startswith(plain):
            uri = scheme + redis_url[len(plain) :]
    if not uri.startswith(("async+redis://", "async+rediss://", "async+redis+unix://")):
        raise InvalidTenantConfig(
            f"REDIS_URL: unsupported scheme in {redis_url!r}; use redis://, rediss:// or unix://"
        )
    pool_url = uri.removeprefix("async+").replace("redis+unix://", "unix://")
    pool = ConnectionPool.from_url(
        pool_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
    )
    pool_option: dict[str, object] = {"connection_pool": pool}
    return RedisStorage(
        uri,
        wrap_exceptions=True,
        implementation="redispy",
        key_prefix=KEY_PREFIX,
        **pool_option,  # type: ignore[arg-type]  # the library passes it to redis-py
    )


async def close_storage(storage: Storage) -> None:
    """Close the Redis connections a store holds (memory stores hold none)."""
    if isinstance(storage, RedisStorage):
        client = getattr(storage.bridge, "storage", None)
        if client is not None:
            await client.aclose(close_connection_pool=True)
