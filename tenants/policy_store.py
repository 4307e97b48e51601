"""Governed tenant policies (`PUT`/`DELETE /v1/tenants/{id}`): where every replica finds them.

A record is one tenant's policy as approved (None: deleted), the version the change got,
the SHA-256 the token bound and who approved it. Versions only grow; `snapshot` returns
them all with the highest version.

- `MemoryPolicyStore`: one process (`STATE_DB=memory`, tests; lost at a restart, where
  the tenants file rules again).
- `SqlitePolicyStore`: the embedded default, in `STATE_DB` (faults/state_db.py): tables
  `policies` (tenant -> record JSON) and `policy_version`; a change is committed (fsynced)
  before `put` returns, so a restart keeps every governed policy and revoked key.
- `RedisPolicyStore`: a versioned document in Redis (`quorum:tenants:policies`, a hash of
  tenant -> record JSON, and `quorum:tenants:version`), changed by one Lua script that
  bumps the version, writes the record and publishes the version on
  `quorum:tenants:changed`; every replica subscribes (`listen`) and re-reads on a message.
  On a Redis Cluster the two keys carry a hash tag, `{quorum:tenants}:policies` and
  `{quorum:tenants}:version`, so the script's keys share one slot. With `replicas`
  (NONCE_REPLICAS) > 0 a change is followed by WAIT on the same connection
  (faults/redis_wait.py); fewer acknowledgements raise `PolicyNotReplicated`: the change
  is on the primary (and announced) but a failover may undo it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from faults.redis_clients import one_slot, ready, redis_client
from faults.redis_wait import (
    Acknowledged,
    ReplicasSetting,
    acknowledging_client,
    replicas_of,
    write_or_refuse,
)
from faults.state_db import StateDb

log = logging.getLogger("quorum.tenants.policies")
T = TypeVar("T")

PREFIX = "quorum:tenants:"
HASH = PREFIX + "policies"
VERSION = PREFIX + "version"
CHANNEL = "quorum:tenants:changed"


class PolicyStoreUnavailable(Exception):
    """The policy store could not be reached."""


class PolicyNotReplicated(PolicyStoreUnavailable):
    """The change is on the primary, but fewer replicas than asked acknowledged it."""


@dataclass(frozen=True, slots=True)
class PolicyRecord:
    tenant: str
    policy: Mapping[str, Any] | None  # None: the tenant was deleted
    version: int
    sha256: str
    approved_by: tuple[str, ...] = ()
    updated_at: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        doc = asdict(self)
        doc["approved_by"] = list(self.approved_by)
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> PolicyRecord:
        doc = json.loads(text)
        return cls(
            tenant=str(doc["tenant"]),
            policy=doc.get("policy"),
            version=int(doc["version"]),
            sha256=str(doc["sha256"]),
            approved_by=tuple(doc.get("approved_by") or ()),
            updated_at=float(doc.get("updated_at") or 0.0),
        )


class PolicyStore(Protocol):
    async def put(
        self,
        tenant: str,
        policy: Mapping[str, Any] | None,
        sha256: str,
        approved_by: tuple[str, ...],
        now: float,
    ) -> PolicyRecord: ...

    async def snapshot(self) -> tuple[int, dict[str, PolicyRecord]]: ...

    async def listen(self, changed: Callable[[], Awaitable[None]]) -> None:
        """Call `changed` whenever another replica changed a policy (runs until cancelled)."""
        ...

    async def aclose(self) -> None: ...


class MemoryPolicyStore:
    def __init__(self) -> None:
        self.version = 0
        self.records: dict[str, PolicyRecord] = {}

    async def put(
        self,
        tenant: str,
        policy: Mapping[str, Any] | None,
        sha256: str,
        approved_by: tuple[str, ...],
        now: float,
    ) -> PolicyRecord:
        self.version += 1
        record = PolicyRecord(tenant, policy, self.version, sha256, approved_by, now)
        self.records[tenant] = record
        return record

    async def snapshot(self) -> tuple[int, dict[str, PolicyRecord]]:
        return self.version, dict(self.records)

    async def listen(self, changed: Callable[[], Awaitable[None]]) -> None:
        await asyncio.Event().wait()  # one process: nobody else changes them

    async def aclose(self) -> None:
        return None


class SqlitePolicyStore:
    """The governed policies in `STATE_DB`; one process changes them (no notifications)."""

    def __init__(self, path: str | Path, sync: str = "full") -> None:
        self._db = StateDb(path, sync)
        self._db.call(_create_policies)

    async def put(
        self,
        tenant: str,
        policy: Mapping[str, Any] | None,
        sha256: str,
        approved_by: tuple[str, ...],
        now: float,
    ) -> PolicyRecord:
        def write(db: sqlite3.Connection) -> PolicyRecord:
            db.execute("UPDATE policy_version SET version = version + 1")
            (version,) = db.execute("SELECT version FROM policy_version").fetchone()
            record = PolicyRecord(tenant, policy, int(version), sha256, approved_by, now)
            db.execute(
                "INSERT INTO policies (tenant, record) VALUES (?, ?) "
                "ON CONFLICT (tenant) DO UPDATE SET record = excluded.record",
                (tenant, record.to_json()),
            )
            return record

        return await self._run(write)

    async def snapshot(self) -> tuple[int, dict[str, PolicyRecord]]:
        def read(db: sqlite3.Connection) -> tuple[int, dict[str, PolicyRecord]]:
            (version,) = db.execute("SELECT version FROM policy_version").fetchone()
            rows = db.execute("SELECT tenant, record FROM policies").fetchall()
            return int(version), {t: PolicyRecord.from_json(text) for t, text in rows}

        return await self._run(read)

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await self._db.run(fn)
        except sqlite3.Error as exc:
            raise PolicyStoreUnavailable(f"{self._db.path}: {exc}") from exc

    async def listen(self, changed: Callable[[], Awaitable[None]]) -> None:
        await asyncio.Event().wait()  # one process: nobody else changes them

    async def aclose(self) -> None:
        self._db.close()


def _create_policies(db: sqlite3.Connection) -> None:
    db.execute(
        "CREATE TABLE IF NOT EXISTS policies (tenant TEXT PRIMARY KEY, record TEXT NOT NULL)"
    )
    db.execute("CREATE TABLE IF NOT EXISTS policy_version (version INTEGER NOT NULL)")
    if db.execute("SELECT COUNT(*) FROM policy_version").fetchone()[0] == 0:
        db.execute("INSERT INTO policy_version (version) VALUES (0)")


_PUT = """
local version = redis.call('INCR', KEYS[2])
local text = string.gsub(ARGV[2], '"version":%-1', '"version":' .. version, 1)
redis.call('HSET', KEYS[1], ARGV[1], text)
redis.call('PUBLISH', ARGV[3], version)
return version
"""


async def _short(done: Acknowledged) -> Exception:
    return PolicyNotReplicated(
        f"version {done.reply} acknowledged by {done.replicas} of {done.asked} replicas"
    )


class RedisPolicyStore:
    def __init__(
        self,
        client: aioredis.Redis,
        url: str,
        *,
        replicas: ReplicasSetting = 0,
        timeout_ms: int = 500,
    ) -> None:
        self._client = client
        self._url = url
        self._replicas = replicas_of(replicas)
        self._timeout_ms = timeout_ms
        prefix = one_slot(url, PREFIX)
        self._hash = prefix + "policies"
        self._version = prefix + "version"

    @classmethod
    def from_url(
        cls,
        url: str,
        timeout_s: float = 2.0,
        *,
        replicas: ReplicasSetting = 0,
        timeout_ms: int = 500,
    ) -> RedisPolicyStore:
        client = acknowledging_client(url, timeout_s, timeout_ms)
        return cls(client, url, replicas=replicas, timeout_ms=timeout_ms)

    async def put(
        self,
        tenant: str,
        policy: Mapping[str, Any] | None,
        sha256: str,
        approved_by: tuple[str, ...],
        now: float,
    ) -> PolicyRecord:
        draft = PolicyRecord(tenant, policy, -1, sha256, approved_by, now).to_json()
        script = ("EVAL", _PUT, 2, self._hash, self._version, tenant, draft, CHANNEL)
        done = await write_or_refuse(
            self._client,
            self._hash,
            script,
            self._replicas,
            self._timeout_ms,
            unavailable=lambda exc: PolicyStoreUnavailable(str(exc)),
            short=_short,
        )
        return PolicyRecord(tenant, policy, int(done.reply), sha256, approved_by, now)

    async def snapshot(self) -> tuple[int, dict[str, PolicyRecord]]:
        try:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.get(self._version)
                pipe.hgetall(self._hash)
                version, raw = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise PolicyStoreUnavailable(str(exc)) from exc
        records = {}
        for key, value in (raw or {}).items():
            records[key.decode() if isinstance(key, bytes) else str(key)] = PolicyRecord.from_json(
                value
            )
        return int(version or 0), records

    async def listen(self, changed: Callable[[], Awaitable[None]]) -> None:
        """Subscribe to the change channel; reconnect after a failure (a second later),
        calling `changed` then too, since messages may have been missed meanwhile."""
        while True:
            client = redis_client(self._url, 5.0)
            try:
                await ready(client)
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(CHANNEL)
                    await changed()
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            await changed()
            except (RedisError, OSError) as exc:
                log.warning("tenant policy notifications lost (%s); retrying in 1 s", exc)
                await asyncio.sleep(1.0)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await client.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()
