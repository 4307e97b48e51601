"""Memory leases: who holds how many MiB on which GPU, shared through the state store.

A lease is a holder's claim on memory per GPU with a time to live. Holders renew
it while they run; a holder that crashes stops renewing and its lease expires,
so its memory is counted free again without anyone cleaning up. Every GPU user
that shares the store (this runner's replicas, training jobs) writes leases, and
each reads all of them (`all`) before placing a model.

Storage only: whether a lease fits is `accounting.py`'s and `placement.py`'s
decision. Reading and then acquiring is not atomic across holders: two holders
may both see room and both acquire. A holder that must not over-commit reads
`all()` again after acquiring and, if `accounting.overcommitted` names a GPU
it leased on, releases and retries later.

Leases in one Redis are per machine: GPU indices mean nothing across hosts,
so each host's runners and jobs use a prefix of their own
(`quorum:mem:lease:<host>:`) when several hosts share a Redis.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from faults.redis_clients import redis_client
from runner.memory.errors import LeaseLost, LeaseStoreUnavailable

log = logging.getLogger("quorum.memory")

Clock = Callable[[], float]
DEFAULT_PREFIX = "quorum:mem:lease:"


@dataclass(frozen=True, slots=True)
class Lease:
    """`holder`'s MiB per GPU index, and the seconds left before it expires
    (`math.inf` for a foreign Redis key written without an expiry)."""

    holder: str
    gpu_mb: Mapping[int, int]
    ttl_left_s: float


class LeaseStore(Protocol):
    async def acquire(self, holder: str, gpu_mb: Mapping[int, int], ttl_s: float) -> None:
        """Set `holder`'s lease to `gpu_mb` for `ttl_s` seconds, replacing any it had."""
        ...

    async def release(self, holder: str) -> None:
        """Drop `holder`'s lease; nothing happens if it has none."""
        ...

    async def renew(self, holder: str, ttl_s: float) -> None:
        """Give `holder`'s lease `ttl_s` seconds from now; `LeaseLost` if it has expired."""
        ...

    async def all(self) -> list[Lease]:
        """Every live lease, this holder's and everyone else's, sorted by holder."""
        ...

    async def aclose(self) -> None: ...


def _check(holder: str, gpu_mb: Mapping[int, int] | None, ttl_s: float) -> None:
    if not holder:
        raise ValueError("a lease needs a holder name")
    if not ttl_s > 0 or math.isinf(ttl_s):
        raise ValueError(f"ttl_s must be a positive number of seconds, not {ttl_s}")
    if gpu_mb is not None:
        if not gpu_mb:
            raise ValueError("a lease names at least one GPU")
        for index, mb in gpu_mb.items():
            if index < 0 or mb < 0:
                raise ValueError(f"bad lease entry GPU {index}: {mb} MB")


class MemoryLeaseStore:
    """One process's leases, expired by the injected clock (single replica, tests)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._leases: dict[str, tuple[dict[int, int], float]] = {}

    async def acquire(self, holder: str, gpu_mb: Mapping[int, int], ttl_s: float) -> None:
        _check(holder, gpu_mb, ttl_s)
        self._leases[holder] = (dict(gpu_mb), self._clock() + ttl_s)

    async def release(self, holder: str) -> None:
        self._leases.pop(holder, None)

    async def renew(self, holder: str, ttl_s: float) -> None:
        _check(holder, None, ttl_s)
        now = self._clock()
        self._purge(now)
        if holder not in self._leases:
            raise LeaseLost(holder=holder)
        gpu_mb, _deadline = self._leases[holder]
        self._leases[holder] = (gpu_mb, now + ttl_s)

    async def all(self) -> list[Lease]:
        now = self._clock()
        self._purge(now)
        return [
            Lease(holder, dict(gpu_mb), deadline - now)
            for holder, (gpu_mb, deadline) in sorted(self._leases.items())
        ]

    def _purge(self, now: float) -> None:
        for holder in [h for h, (_, deadline) in self._leases.items() if deadline <= now]:
            del self._leases[holder]

    async def aclose(self) -> None:
        return None


def _escape_glob(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class RedisLeaseStore:
    """Leases every process sharing the Redis sees: one key per holder,
    `<prefix><holder>` = `{"gpu_mb": {"0": 12000}}`, expiring with Redis' own TTL."""

    def __init__(self, client: aioredis.Redis, prefix: str = DEFAULT_PREFIX) -> None:
        self._client = client
        self._prefix = prefix

    @classmethod
    def from_url(
        cls, url: str, prefix: str = DEFAULT_PREFIX, timeout_s: float = 2.0
    ) -> RedisLeaseStore:
        client = redis_client(url, timeout_s)
        return cls(client, prefix)

    def key(self, holder: str) -> str:
        return self._prefix + holder

    @staticmethod
    @contextlib.contextmanager
    def _redis_errors(operation: str) -> Iterator[None]:
        """The one place redis-py's errors become ours."""
        try:
            yield
        except (RedisError, OSError) as exc:
            raise LeaseStoreUnavailable(
                f"memory lease store unreachable during {operation} ({type(exc).__name__}); "
                "loads are refused until it is back"
            ) from exc

    async def acquire(self, holder: str, gpu_mb: Mapping[int, int], ttl_s: float) -> None:
        _check(holder, gpu_mb, ttl_s)
        value = orjson.dumps({"gpu_mb": {str(i): mb for i, mb in gpu_mb.items()}})
        with self._redis_errors("acquire"):
            await self._client.set(self.key(holder), value, px=math.ceil(ttl_s * 1000))

    async def release(self, holder: str) -> None:
        with self._redis_errors("release"):
            await self._client.delete(self.key(holder))

    async def renew(self, holder: str, ttl_s: float) -> None:
        _check(holder, None, ttl_s)
        with self._redis_errors("renew"):
            renewed = await self._client.pexpire(self.key(holder), math.ceil(ttl_s * 1000))
        if not renewed:
            raise LeaseLost(holder=holder)

    async def all(self) -> list[Lease]:
        """SCAN the prefix, then GET and PTTL every key in one pipeline."""
        with self._redis_errors("read"):
            keys = [
                key
                async for key in self._client.scan_iter(
                    match=_escape_glob(self._prefix) + "*", count=500
                )
            ]
            if not keys:
                return []
            async with self._client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.get(key)
                    pipe.pttl(key)
                replies = await pipe.execute()
        leases: list[Lease] = []
        for key, value, pttl in zip(keys, replies[::2], replies[1::2], strict=True):
            if value is None or pttl == -2:  # expired between SCAN and GET
                continue
            holder = key.decode()[len(self._prefix) :]
            lease = self._parse(holder, value, pttl)
            if lease is not None:
                leases.append(lease)
        return sorted(leases, key=lambda lease: lease.holder)

    @staticmethod
    def _parse(holder: str, value: bytes, pttl: int) -> Lease | None:
        try:
            raw = orjson.loads(value)["gpu_mb"]
            gpu_mb = {int(index): int(mb) for index, mb in raw.items()}
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            log.warning("memory lease %r is unreadable and not counted: %r", holder, value[:200])
            return None
        return Lease(holder, gpu_mb, math.inf if pttl < 0 else pttl / 1000)

    async def aclose(self) -> None:
        await self._client.aclose()
