"""Nonce stores: remember a token's nonce until the token could no longer be accepted.

`consume` is one atomic set-if-absent with expiry: True the first time a nonce is seen
(within its ttl), False afterwards. A store that cannot answer raises
NonceStoreUnavailable, and the verifier fails closed (503).

- `MemoryNonceStore`: one process (`STATE_DB=memory`, tests): a restart forgets them.
- `SqliteNonceStore`: the embedded default, in `STATE_DB` (faults/state_db.py): the
  spend is committed (fsynced, with STATE_DB_SYNC=full) before `consume` returns, so
  before the 200.
- `RedisNonceStore`: every replica's, in Redis. With `replicas` (NONCE_REPLICAS) > 0 the
  spend is followed by `WAIT replicas timeout` on the same connection
  (faults/redis_wait.py): a spend fewer replicas acknowledged is not trusted, since a
  failover could promote a replica without it. The nonce is then released on the
  primary (deleted if it still holds this spend's value) and `NonceNotReplicated` (503
  `nonce_store_unavailable`) refuses the operation, which never ran: the same token may
  be sent again. If the release fails too, the nonce stays spent (fail closed: 409 on a
  retry, the signers sign a new token).
"""

from __future__ import annotations

import heapq
import logging
import secrets
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from faults.redis_wait import (
    Acknowledged,
    ReplicasSetting,
    acknowledging_client,
    replicas_of,
    write_or_refuse,
)
from faults.state_db import StateDb
from governance.errors import NonceNotReplicated, NonceStoreUnavailable

Clock = Callable[[], float]
log = logging.getLogger("quorum.governance.nonces")


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


_RELEASED = "released: send the same token again"
_KEPT = "kept spent (the release failed): ask for a new token"
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def _unavailable(exc: Exception) -> Exception:
    return NonceStoreUnavailable(
        f"nonce store unreachable ({type(exc).__name__}); lifecycle operations are "
        "refused until it is back"
    )


class RedisNonceStore:
    """Nonces shared by every replica: `SET <prefix><nonce> <spend> NX EX ttl` in Redis,
    then, with `replicas` > 0, `WAIT replicas timeout_ms` on the same connection."""

    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str = "quorum:gov:nonce:",
        *,
        replicas: ReplicasSetting = 0,
        timeout_ms: int = 500,
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._replicas = replicas_of(replicas)
        self._timeout_ms = timeout_ms

    @classmethod
    def from_url(
        cls,
        url: str,
        timeout_s: float = 2.0,
        *,
        replicas: ReplicasSetting = 0,
        timeout_ms: int = 500,
    ) -> RedisNonceStore:
        """The client's socket timeout outlasts the WAIT (`acknowledging_client`)."""
        client = acknowledging_client(url, timeout_s, timeout_ms)
        return cls(client, replicas=replicas, timeout_ms=timeout_ms)

    def key(self, nonce: str) -> str:
        return self._prefix + nonce

    async def consume(self, nonce: str, ttl_s: int) -> bool:
        """1. SET NX EX with a value of this spend's own (then WAIT, when asked).
        2. Already there -> False (a replay).
        3. Fewer replicas acknowledged than asked -> release it, raise NonceNotReplicated.
        Redis errors raise NonceStoreUnavailable."""
        if ttl_s < 1:
            raise ValueError("ttl_s must be at least 1 second")
        key, spend = self.key(nonce), secrets.token_hex(8)

        async def short(done: Acknowledged) -> Exception:  # 3
            released = await self._release(key, spend)
            return NonceNotReplicated(
                replicasAcked=done.replicas,
                replicasAsked=done.asked,
                timeoutMs=self._timeout_ms,
                released=_RELEASED if released else _KEPT,
            )

        done = await write_or_refuse(  # 1
            self._client,
            key,
            ("SET", key, spend, "NX", "EX", ttl_s),
            self._replicas,
            self._timeout_ms,
            unavailable=_unavailable,
            short=short,
        )
        return bool(done.reply)  # 2: False, a replay

    async def _release(self, key: str, spend: str) -> bool:
        """Delete the nonce if it still holds `spend`; False when that could not be done."""
        try:
            await self._client.eval(_RELEASE, 1, key, spend)
        except (RedisError, OSError) as exc:
            log.warning("an unacknowledged nonce could not be released (%s)", exc)
            return False
        return True

    async def aclose(self) -> None:
        await self._client.aclose()
