"""Where the budgets' window counters live: one process (`MemoryBudgetStore`) or Redis,
shared by every replica (`RedisBudgetStore`). Both do what `tenants.budgets.BudgetBook`
does; `tests/tenants/test_budget_store.py` runs one suite against both.

Redis: a counter is the key `quorum:budget:{<tenant>}|<per>:<count>:<model>|<start>` (the
tenant in braces: one cluster slot for all of a tenant's counters, so one script can hold
them all), with a TTL of the window's end plus `GRACE_S`; its held part (reserved by
requests not settled yet) is `quorum:budget:held:{<tenant>}|...`, same slot, same TTL.
`reserve` is one Lua script (one round trip) that checks every counter and adds every
charge or none; `adjust` is another. Failures raise `BudgetStoreUnavailable`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from faults.redis_clients import redis_client
from tenants.budgets import BudgetBook, Charge, ReserveAttempt, Settlement

PREFIX = "quorum:budget:"


class BudgetStoreUnavailable(Exception):
    """The store could not be reached; the caller decides (fail closed: 503)."""


class BudgetStore(Protocol):
    @property
    def book(self) -> BudgetBook | None:
        """The counters when they are in this process (memory): its calls complete without
        awaiting, so the data path calls them directly (no coroutine, no task); None for a
        store across the network."""
        ...

    async def reserve(self, charges: Sequence[Charge], now: float) -> ReserveAttempt:
        """`BudgetBook.reserve`: 0 and the counters after, or the refused index + 1, the
        counters read and the refused counter's held part."""
        ...

    async def adjust(self, settlements: Sequence[Settlement], now: float) -> None: ...

    async def used(self, keys: Sequence[str], now: float) -> list[int]: ...

    async def held(self, keys: Sequence[str], now: float) -> list[int]:
        """The part of each counter reserved by requests not settled yet."""
        ...

    async def aclose(self) -> None: ...


class MemoryBudgetStore:
    """The counters in this process (the embedded default)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.book = BudgetBook()
        self._clock = clock

    async def reserve(self, charges: Sequence[Charge], now: float) -> ReserveAttempt:
        return self.book.reserve(charges, now)

    async def adjust(self, settlements: Sequence[Settlement], now: float) -> None:
        self.book.adjust(settlements, now)

    async def used(self, keys: Sequence[str], now: float) -> list[int]:
        return [self.book.used(key, now) for key in keys]

    async def held(self, keys: Sequence[str], now: float) -> list[int]:
        return [self.book.held(key, now) for key in keys]

    async def aclose(self) -> None:
        return None


# KEYS: the counters, then their held parts; ARGV per charge: limit, amount, ttl.
# Refused: {index, held part of the refused counter, counters read}; else {0, 0, counters}.
_RESERVE = """
local n = #KEYS / 2
local used = {}
for i = 1, n do
  local count = tonumber(redis.call('GET', KEYS[i]) or '0')
  used[i] = count
  if count + tonumber(ARGV[3 * i - 1]) > tonumber(ARGV[3 * i - 2]) then
    return {i, tonumber(redis.call('GET', KEYS[n + i]) or '0'), unpack(used)}
  end
end
for i = 1, n do
  used[i] = redis.call('INCRBY', KEYS[i], ARGV[3 * i - 1])
  redis.call('EXPIRE', KEYS[i], ARGV[3 * i])
  redis.call('INCRBY', KEYS[n + i], ARGV[3 * i - 1])
  redis.call('EXPIRE', KEYS[n + i], ARGV[3 * i])
end
return {0, 0, unpack(used)}
"""
# KEYS: the counters, then their held parts; ARGV per counter: delta, released.
_ADJUST = """
local n = #KEYS / 2
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    if redis.call('INCRBY', KEYS[i], ARGV[2 * i - 1]) < 0 then
      redis.call('SET', KEYS[i], 0, 'KEEPTTL')
    end
  end
  if redis.call('EXISTS', KEYS[n + i]) == 1 then
    if redis.call('DECRBY', KEYS[n + i], ARGV[2 * i]) < 0 then
      redis.call('SET', KEYS[n + i], 0, 'KEEPTTL')
    end
  end
end
return 0
"""


def redis_key(key: str) -> str:
    tenant, _, rest = key.partition("|")
    return f"{PREFIX}{{{tenant}}}|{rest}"


def held_key(key: str) -> str:
    """The Redis key of a counter's held part (the same cluster slot as the counter)."""
    tenant, _, rest = key.partition("|")
    return f"{PREFIX}held:{{{tenant}}}|{rest}"


class RedisBudgetStore:
    """The counters in Redis, shared by every replica."""

    book: BudgetBook | None = None  # across the network: every call awaits

    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client
        self._reserve = client.register_script(_RESERVE)
        self._adjust = client.register_script(_ADJUST)

    @classmethod
    def from_url(cls, url: str, timeout_s: float = 0.25) -> RedisBudgetStore:
        return cls(redis_client(url, timeout_s))

    async def reserve(self, charges: Sequence[Charge], now: float) -> ReserveAttempt:
        if not charges:
            return ReserveAttempt(0, ())
        args: list[int] = []
        for charge in charges:
            args += [charge.limit, charge.amount, charge.ttl_s(now)]
        keys = [redis_key(c.key) for c in charges] + [held_key(c.key) for c in charges]
        try:
            answer = await self._reserve(keys=keys, args=args)
        except (RedisError, OSError) as exc:
            raise BudgetStoreUnavailable(str(exc)) from exc
        refused, held, *counters = (int(v) for v in answer)
        if refused:  # the counters read up to the refused one; the rest were not read
            counters += [0] * (len(charges) - len(counters))
        return ReserveAttempt(refused, tuple(counters), held)

    async def adjust(self, settlements: Sequence[Settlement], now: float) -> None:
        if not settlements:
            return
        keys = [redis_key(k) for k, _, _ in settlements]
        keys += [held_key(k) for k, _, _ in settlements]
        args: list[int] = []
        for _, delta, released in settlements:
            args += [delta, released]
        try:
            await self._adjust(keys=keys, args=args)
        except (RedisError, OSError) as exc:
            raise BudgetStoreUnavailable(str(exc)) from exc

    async def used(self, keys: Sequence[str], now: float) -> list[int]:
        return await self._mget([redis_key(k) for k in keys])

    async def held(self, keys: Sequence[str], now: float) -> list[int]:
        return await self._mget([held_key(k) for k in keys])

    async def _mget(self, keys: list[str]) -> list[int]:
        if not keys:
            return []
        try:  # GETs in one pipeline, not MGET: on a cluster the tenants' slots differ
            async with self._client.pipeline(transaction=False) as pipe:
                for k in keys:
                    pipe.get(k)
                values = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise BudgetStoreUnavailable(str(exc)) from exc
        return [int(v) if v is not None else 0 for v in values]

    async def aclose(self) -> None:
        await self._client.aclose()
