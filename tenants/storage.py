"""Build the rate-limit store: in-process memory, or Redis shared by every replica."""

from __future__ import annotations

import time
from typing import Any, cast

import redis.asyncio
from limits.aio.storage import RedisClusterStorage, RedisStorage, Storage
from limits.aio.storage.redis.redispy import RedispyBridge
from limits.errors import StorageError
from redis.exceptions import NoScriptError, RedisError
from redis.typing import EncodableT

from faults.redis_clients import (
    is_cluster_url,
    is_sentinel_url,
    parse_cluster_url,
    redis_pool,
)
from faults.redis_wait import node_pipeline
from tenants.errors import InvalidTenantConfig
from tenants.memory_store import Clock, MemoryWindowStorage, Window

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
    library's own `async+redis://` spellings are accepted too), or a sentinel URL
    (faults/redis_clients.py), whose pool follows the primary. Connect and command time
    out after `timeout_s`, so a hung Redis fails a request fast instead of holding it.
    Redis windows run on Redis' clock (key TTLs), not on `clock`. A cluster URL gives the
    library's cluster storage (the two keys of a window share the hash tag it puts in them:
    `quorum:{LIMITER/...}` and `quorum:{LIMITER/...}/-1`).
    """
    if not redis_url:
        return MemoryWindowStorage(clock)
    if is_cluster_url(redis_url):
        target = parse_cluster_url(redis_url)
        nodes = ",".join(f"{host}:{port}" for host, port in target.nodes)
        options: dict[str, float | str | bool] = {
            "socket_timeout": timeout_s,
            "socket_connect_timeout": timeout_s,
            "ssl": target.ssl,
        }
        if target.username:
            options["username"] = target.username
        if target.password:
            options["password"] = target.password
        return SharedRedisClusterStorage(
            f"async+redis+cluster://{nodes}",
            wrap_exceptions=True,
            implementation="redispy",
            key_prefix=KEY_PREFIX,
            **options,
        )
    if is_sentinel_url(redis_url):  # the pool finds the primary; the URI only names a kind
        return SharedRedisStorage(
            "async+redis://sentinel:26379",
            wrap_exceptions=True,
            implementation="redispy",
            key_prefix=KEY_PREFIX,
            connection_pool=redis_pool(redis_url, timeout_s),  # type: ignore[arg-type]
        )
    uri = redis_url
    for plain, scheme in _SCHEMES.items():
        if redis_url.startswith(plain):
            uri = scheme + redis_url[len(plain) :]
    if not uri.startswith(("async+redis://", "async+rediss://", "async+redis+unix://")):
        raise InvalidTenantConfig(
            f"REDIS_URL: unsupported scheme in {redis_url!r}; use redis://, rediss:// or unix://"
        )
    pool_url = uri.removeprefix("async+").replace("redis+unix://", "unix://")
    pool = redis_pool(pool_url, timeout_s)  # one retry on a connection a restart closed
    pool_option: dict[str, object] = {"connection_pool": pool}
    return SharedRedisStorage(
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
        if isinstance(client, redis.asyncio.RedisCluster):
            await client.aclose()  # its nodes' connections with it
        elif client is not None:
            await client.aclose(close_connection_pool=True)


class SharedRedisStorage(RedisStorage):
    """The library's Redis storage plus `acquire_and_read`: its two sliding-window scripts
    (acquire, then read the window) sent in one pipeline, so a decision costs one round trip
    instead of two. Everything else is the library's own code."""

    STORAGE_SCHEME: list[str] = []  # not registered under a scheme of its own

    async def acquire_and_read(self, key: str, limit: int, expiry: int) -> tuple[bool, Window]:
        """Acquire one entry and read the window after it, in one round trip.

        1. Pipeline EVALSHA(acquire) + EVALSHA(window) on the library's scripts and keys.
        2. Scripts missing (new or restarted server): load them; if the acquire did not run,
           run everything again, else read the window with the library's call.
        3. Redis errors become `limits.errors.StorageError`, as the library's calls raise.
        """
        bridge = self.bridge
        if not isinstance(bridge, RedispyBridge):  # pragma: no cover - we build redispy only
            acquired = await self.acquire_sliding_window_entry(key, limit, expiry)
            return acquired, await self.get_sliding_window(key, expiry)
        previous = bridge.prefixed_key(self._previous_window_key(key))
        current = bridge.prefixed_key(self._current_window_key(key))
        acquire, window = bridge.lua_acquire_sliding_window, bridge.lua_sliding_window
        client = cast("redis.asyncio.Redis", bridge.get_connection())
        try:
            # 1. one round trip
            acquired, raw = await self._pipelined(
                client,
                current,
                ("EVALSHA", acquire.sha, 2, previous, current, limit, expiry, 1),
                ("EVALSHA", window.sha, 2, previous, current, expiry),
            )
            # 2. scripts not loaded yet
            if isinstance(acquired, NoScriptError) or isinstance(raw, NoScriptError):
                for script in (acquire, window):
                    await client.script_load(script.script)
                if isinstance(acquired, NoScriptError):
                    return await self.acquire_and_read(key, limit, expiry)
                return bool(acquired), await self.get_sliding_window(key, expiry)
            for result in (acquired, raw):
                if isinstance(result, Exception):
                    raise result
        except RedisError as exc:
            # 3. the library's error type
            raise StorageError(exc) from exc
        return bool(acquired), (
            int(raw[0] or 0),
            max(0.0, float(raw[1] or 0)) / 1000,
            int(raw[2] or 0),
            max(0.0, float(raw[3] or 0)) / 1000,
        )

    async def _pipelined(
        self, client: redis.asyncio.Redis, key: str, *commands: tuple[EncodableT, ...]
    ) -> list[Any]:
        """`commands` in one pipeline; each reply or the error it was."""
        async with client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            return await pipe.execute(raise_on_error=False)


class SharedRedisClusterStorage(SharedRedisStorage, RedisClusterStorage):
    """`acquire_and_read` on the library's Redis Cluster storage: the pipeline goes to the
    node of the window's slot (both keys carry one hash tag)."""

    STORAGE_SCHEME: list[str] = []  # not registered under a scheme of its own

    async def _pipelined(
        self, client: redis.asyncio.Redis, key: str, *commands: tuple[EncodableT, ...]
    ) -> list[Any]:
        return await node_pipeline(cast("redis.asyncio.RedisCluster", client), key, commands)
