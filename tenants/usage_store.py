"""Where usage is kept so that it survives a restart: SQLite (the embedded default, a file)
or Redis (shared by every replica). One suite runs against both
(`tests/tenants/test_usage_store.py`).

Both add batches of counts (`add`), answer the hours of a range (`query`, optionally one
tenant and one model) and forget hours older than the retention (`prune`; Redis: each
hour's key expires by itself).

- SQLite: one table `usage(hour, tenant, model, <counter>...)`, primary key the first
  three, upserted; calls run in a worker thread (never on the event loop).
- Redis: one hash per hour, `quorum:usage:<hour start>`, fields `<tenant>\\x1f<model>
  \\x1f<counter>`, added with HINCRBY / HINCRBYFLOAT in one pipeline per batch, expiring
  `retention_s` after the hour.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from faults.redis_clients import redis_client
from tenants.usage import FLOAT_FIELDS, HOUR, INT_FIELDS, Counts, Key

PREFIX = "quorum:usage:"
SEP = "\x1f"
_COLUMNS = INT_FIELDS + FLOAT_FIELDS


class UsageStoreUnavailable(Exception):
    pass


class UsageStore(Protocol):
    async def add(self, batch: Mapping[Key, Counts]) -> None: ...

    async def query(
        self, start: int, end: int, tenant: str | None = None, model: str | None = None
    ) -> dict[Key, Counts]:
        """Hours in [start, end) (hour starts), of `tenant` and `model` when given."""
        ...

    async def prune(self, before: int) -> None: ...

    async def aclose(self) -> None: ...


class SqliteUsageStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=10)
        self._lock = threading.Lock()
        cols = ", ".join(
            f"{c} {'REAL' if c in FLOAT_FIELDS else 'INTEGER'} NOT NULL DEFAULT 0" for c in _COLUMNS
        )
        with self._lock, self._db:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(
                f"CREATE TABLE IF NOT EXISTS usage (hour INTEGER NOT NULL, tenant TEXT NOT NULL, "
                f"model TEXT NOT NULL, {cols}, PRIMARY KEY (hour, tenant, model))"
            )

    async def add(self, batch: Mapping[Key, Counts]) -> None:
        if batch:
            await asyncio.to_thread(self._add, dict(batch))

    def _add(self, batch: dict[Key, Counts]) -> None:
        names = ", ".join(_COLUMNS)
        marks = ", ".join("?" for _ in _COLUMNS)
        update = ", ".join(f"{c} = {c} + excluded.{c}" for c in _COLUMNS)
        sql = (
            f"INSERT INTO usage (hour, tenant, model, {names}) VALUES (?, ?, ?, {marks}) "
            f"ON CONFLICT (hour, tenant, model) DO UPDATE SET {update}"
        )
        values = [
            (hour, tenant, model, *(getattr(c, name) for name in _COLUMNS))
            for (hour, tenant, model), c in batch.items()
        ]
        try:
            with self._lock, self._db:
                self._db.executemany(sql, values)
        except sqlite3.Error as exc:
            raise UsageStoreUnavailable(str(exc)) from exc

    async def query(
        self, start: int, end: int, tenant: str | None = None, model: str | None = None
    ) -> dict[Key, Counts]:
        return await asyncio.to_thread(self._query, start, end, tenant, model)

    def _query(
        self, start: int, end: int, tenant: str | None, model: str | None
    ) -> dict[Key, Counts]:
        columns = ", ".join(_COLUMNS)
        sql = f"SELECT hour, tenant, model, {columns} FROM usage WHERE hour >= ? AND hour < ?"
        args: list[object] = [start, end]
        if tenant is not None:
            sql += " AND tenant = ?"
            args.append(tenant)
        if model is not None:
            sql += " AND model = ?"
            args.append(model)
        try:
            with self._lock:
                found = self._db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise UsageStoreUnavailable(str(exc)) from exc
        return {(row[0], row[1], row[2]): Counts(*row[3:]) for row in found}

    async def prune(self, before: int) -> None:
        def run() -> None:
            with self._lock, self._db:
                self._db.execute("DELETE FROM usage WHERE hour < ?", (before,))

        await asyncio.to_thread(run)

    async def aclose(self) -> None:
        with self._lock:
            self._db.close()


class RedisUsageStore:
    def __init__(self, client: aioredis.Redis, retention_s: int) -> None:
        self._client = client
        self._retention_s = retention_s

    @classmethod
    def from_url(cls, url: str, retention_s: int, timeout_s: float = 2.0) -> RedisUsageStore:
        return cls(redis_client(url, timeout_s), retention_s)

    async def add(self, batch: Mapping[Key, Counts]) -> None:
        if not batch:
            return
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                hours = set()
                for (hour, tenant, model), counts in batch.items():
                    key = f"{PREFIX}{hour}"
                    hours.add(hour)
                    for name, value in counts.items():
                        field = f"{tenant}{SEP}{model}{SEP}{name}"
                        if isinstance(value, float):
                            pipe.hincrbyfloat(key, field, value)
                        else:
                            pipe.hincrby(key, field, value)
                for hour in hours:
                    pipe.expireat(f"{PREFIX}{hour}", hour + HOUR + self._retention_s)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            raise UsageStoreUnavailable(str(exc)) from exc

    async def query(
        self, start: int, end: int, tenant: str | None = None, model: str | None = None
    ) -> dict[Key, Counts]:
        hours = list(range(start, end, HOUR))
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for hour in hours:
                    pipe.hgetall(f"{PREFIX}{hour}")
                answers = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise UsageStoreUnavailable(str(exc)) from exc
        found: dict[Key, Counts] = {}
        for hour, fields in zip(hours, answers, strict=True):
            for raw, value in (fields or {}).items():
                who, what, name = raw.decode().split(SEP)
                if (tenant is not None and who != tenant) or (model is not None and what != model):
                    continue
                counts = found.setdefault((hour, who, what), Counts())
                number = float(value) if name in FLOAT_FIELDS else int(value)
                setattr(counts, name, getattr(counts, name) + number)
        return found

    async def prune(self, before: int) -> None:
        return None  # every hour's key expires by itself

    async def aclose(self) -> None:
        await self._client.aclose()
