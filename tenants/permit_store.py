"""Permits of a tenant's in-flight cap shared by every replica (Redis), a semaphore.

One sorted set per tenant, `quorum:inflight:{<tenant>}`: a member per permit held
(`<replica>:<n>`), scored by when it expires (Redis' own clock). `acquire` is one Lua
script: drop expired members, then add one if fewer than the cap are held. `release`
(a script too) removes one and publishes the tenant on `quorum:inflight:freed`, so
replicas waiting for a permit try at once; `renew` pushes the expiry of the permits a
replica holds, so a replica that dies gives its permits back after `ttl_s`.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from faults.redis_clients import redis_client

PREFIX = "quorum:inflight:"
FREED = "quorum:inflight:freed"

_ACQUIRE = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[3]), ARGV[2])
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) * 2)
  return 1
end
return 0
"""
_RENEW = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', ms + tonumber(ARGV[1]), ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]) * 2)
return 0
"""

# One script, not MULTI: a cluster client refuses PUBLISH (no key) in its pipelines.
_RELEASE = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 0
"""


class PermitStoreUnavailable(Exception):
    pass


def key(tenant: str) -> str:
    return f"{PREFIX}{{{tenant}}}"


class RedisPermitStore:
    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    @classmethod
    def from_url(cls, url: str, timeout_s: float = 2.0) -> RedisPermitStore:
        return cls(redis_client(url, timeout_s))

    async def acquire(self, tenant: str, cap: int, holder: str, ttl_s: float) -> bool:
        try:
            got = await self._acquire(keys=[key(tenant)], args=[cap, holder, int(ttl_s * 1000)])
        except (RedisError, OSError) as exc:
            raise PermitStoreUnavailable(str(exc)) from exc
        return bool(got)

    async def release(self, tenant: str, holder: str) -> None:
        try:
            await self._release(keys=[key(tenant)], args=[holder, FREED, tenant])
        except (RedisError, OSError) as exc:
            raise PermitStoreUnavailable(str(exc)) from exc

    async def renew(self, tenant: str, holders: Sequence[str], ttl_s: float) -> None:
        if not holders:
            return
        try:
            await self._renew(keys=[key(tenant)], args=[int(ttl_s * 1000), *holders])
        except (RedisError, OSError) as exc:
            raise PermitStoreUnavailable(str(exc)) from exc

    async def held(self, tenant: str) -> int:
        """Permits held now by every replica (expired ones may count until the next acquire)."""
        try:
            return int(await self.client.zcard(key(tenant)))
        except (RedisError, OSError) as exc:
            raise PermitStoreUnavailable(str(exc)) from exc

    async def aclose(self) -> None:
        await self.client.aclose()
