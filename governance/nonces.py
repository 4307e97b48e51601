"""Nonce stores: remember a token's nonce until the token could no longer be accepted.

`consume` is one atomic set-if-absent with expiry: True the first time a nonce is seen
(within its ttl), False afterwards. A store that cannot answer raises
NonceStoreUnavailable, and the verifier fails closed (503).

- `MemoryNonceStore`: one process (`STATE_DB=memory`, tests): a restart forgets them.
- `SqliteNonceStore`: the embedded default, in `STATE_DB` (faults/state_db.py): the
  spend is committed (fsynced, with STATE_DB_SYNC=full) before `consume` returns, so
  before the 200.
- `RedisNonceStore`: every replica's, in Redis.
"""

from __future__ import annotations

import heapq
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from faults.redis_clients import redis_client
from faults.state_db import StateDb
from governance.errors import NonceStoreUnavailable

Clock = Callable[[], float]


class NonceStore(Protocol):
    async def consume(self, nonce: str, ttl_s: int) -> bool:
        """Atomically record `nonce` for `ttl_s` seconds; False if it was already there."""
        ...

    async def aclose(self) -> None: ...


class MemoryNonceStore:
    """One process's nonces, expired by the injected clock (the embedded default)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._expiry: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []

    async def consume(self, nonce: str, ttl_s: int) -> bool:
        if ttl_s < 1:
            raise ValueError("ttl_s must be at least 1 second")
        now = self._clock()
        self._purge(now)
        if nonce in self._expiry:
            return False
        deadline = now + ttl_s
        self._expiry[nonce] = deadline
        heapq.heappush(self._heap, (deadline, nonce))
        return True

    def __len__(self) -> int:
        return len(self._expiry)

    def _purge(self, now: float) -> None:
        while self._heap and self._heap[0][0] <= now:
            deadline, nonce = heapq.heappop(self._heap)
            if self._expiry.get(nonce) == deadline:
                del self._expiry[nonce]

    async def aclose(self) -> None:
        return None


class SqliteNonceStore:
    """Nonces in the `nonces` table of `STATE_DB`, each row kept until its expiry (the
    expired ones are deleted by the next consume)."""

    def __init__(self, path: str | Path, clock: Clock, sync: str = "full") -> None:
        self._db = StateDb(path, sync)
        self._clock = clock
        self._db.call(_create_nonces)

    async def consume(self, nonce: str, ttl_s: int) -> bool:
        if ttl_s < 1:
            raise ValueError("ttl_s must be at least 1 second")
        now = self._clock()

        def spend(db: sqlite3.Connection) -> bool:
            db.execute("DELETE FROM nonces WHERE expires <= ?", (now,))
            cursor = db.execute(
                "INSERT OR IGNORE INTO nonces (nonce, expires) VALUES (?, ?)", (nonce, now + ttl_s)
            )
            return cursor.rowcount == 1

        try:
            return await self._db.run(spend)
        except sqlite3.Error as exc:
            raise NonceStoreUnavailable(
                f"nonce store {self._db.path} failed ({exc}); lifecycle operations are "
                "refused until it works"
            ) from exc

    async def aclose(self) -> None:
        self._db.close()


def _create_nonces(db: sqlite3.Connection) -> None:
    db.execute("CREATE TABLE IF NOT EXISTS nonces (nonce TEXT PRIMARY KEY, expires REAL NOT NULL)")
    db.execute("CREATE INDEX IF NOT EXISTS nonces_expires ON nonces (expires)")


class RedisNonceStore:
    """Nonces shared by every replica: `SET <prefix><nonce> 1 NX EX ttl` in Redis."""

    def __init__(self, client: aioredis.Redis, prefix: str = "quorum:gov:nonce:") -> None:
        self._client = client
        self._prefix = prefix

    @classmethod
    def from_url(cls, url: str, timeout_s: float = 2.0) -> RedisNonceStore:
        client = redis_client(url, timeout_s)
        return cls(client)

    def key(self, nonce: str) -> str:
        return self._prefix + nonce

    async def consume(self, nonce: str, ttl_s: int) -> bool:
        if ttl_s < 1:
            raise ValueError("ttl_s must be at least 1 second")
        try:
            created = await self._client.set(self.key(nonce), b"1", nx=True, ex=ttl_s)
        except (RedisError, OSError) as exc:
            raise NonceStoreUnavailable(
                f"nonce store unreachable ({type(exc).__name__}); lifecycle operations are "
                "refused until it is back"
            ) from exc
        return bool(created)

    async def aclose(self) -> None:
        await self._client.aclose()
