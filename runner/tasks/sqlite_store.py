"""Load tasks in `STATE_DB` (the embedded default), so a restarted runner still answers for
the tasks it had: finished ones until their retention ends, and active ones failed as
interrupted by `mark_interrupted` at start-up (see `store.py` for the promises every store
keeps; one suite tests them).

One table, `load_tasks(task_id, runner_id, model_id, active, created_at, expires,
record)`: `record` is the task as JSON, `expires` the end of a finished task's retention
(NULL while active). Every call is one transaction in a worker thread
(faults/state_db.py): the read of the stored status and the write that depends on it
cannot interleave with another call, as a Redis script cannot. SQLite failures become
`TaskStoreUnavailable` (503) in one place, `_run`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import orjson

from faults.state_db import StateDb
from runner.tasks.errors import TaskStoreUnavailable
from runner.tasks.record import LoadTask
from runner.tasks.state import may_overwrite
from runner.tasks.store import (
    DEFAULT_RETENTION_S,
    DEFAULT_STALE_AFTER_S,
    Clock,
    check_new,
    fail_each,
    interrupted_reason,
    is_stale,
    stale_reason,
)

T = TypeVar("T")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS load_tasks (task_id TEXT PRIMARY KEY, runner_id TEXT NOT NULL,"
    " model_id TEXT NOT NULL, active INTEGER NOT NULL, created_at REAL NOT NULL,"
    " expires REAL, record BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS load_tasks_active ON load_tasks (active, runner_id, model_id)",
)


def _decode(raw: bytes | str) -> LoadTask:
    return LoadTask.from_record(orjson.loads(raw))


class SqliteTaskStore:
    """One runner's tasks in a file that outlives it; the injected clock ages finished ones."""

    def __init__(
        self,
        path: str | Path,
        clock: Clock,
        *,
        retention_s: int = DEFAULT_RETENTION_S,
        stale_after_s: float | None = DEFAULT_STALE_AFTER_S,
        sync: str = "full",
    ) -> None:
        if retention_s < 1:
            raise ValueError("retention_s must be at least 1 second")
        self._db = StateDb(path, sync)
        self._clock = clock
        self._retention_s = retention_s
        self._stale_after_s = stale_after_s
        self._db.call(lambda db: [db.execute(sql) for sql in _SCHEMA])

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await self._db.run(fn)
        except sqlite3.Error as exc:
            raise TaskStoreUnavailable(detail=type(exc).__name__, retry_after=1) from exc

    def _stored(self, db: sqlite3.Connection, task_id: str) -> LoadTask | None:
        row = db.execute(
            "SELECT record FROM load_tasks WHERE task_id = ? AND (expires IS NULL OR expires > ?)",
            (task_id, self._clock()),
        ).fetchone()
        return None if row is None else _decode(row[0])

    def _write(self, db: sqlite3.Connection, task: LoadTask) -> LoadTask:
        """The guarded write of `put`, inside the caller's transaction."""
        now = self._clock()
        db.execute("DELETE FROM load_tasks WHERE expires <= ?", (now,))
        stored = self._stored(db, task.task_id)
        if stored is not None and not may_overwrite(stored.status, task.status):
            return stored
        expires = now + self._retention_s if task.status.terminal else None
        db.execute(
            "INSERT INTO load_tasks (task_id, runner_id, model_id, active, created_at, expires,"
            " record) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (task_id) DO UPDATE SET"
            " active = excluded.active, expires = excluded.expires, record = excluded.record",
            (
                task.task_id,
                task.runner_id,
                task.model_id,
                int(task.status.active),
                task.created_at,
                expires,
                orjson.dumps(task.to_record()),
            ),
        )
        return task

    async def put(self, task: LoadTask) -> LoadTask:
        return await self._run(lambda db: self._write(db, task))

    async def get(self, task_id: str) -> LoadTask | None:
        return await self._run(lambda db: self._stored(db, task_id))

    async def create_or_join(self, task: LoadTask) -> tuple[LoadTask, bool]:
        """1. The runner's active task for the model, written within `stale_after_s` -> join it.
        2. It exists but is stale -> fail it as interrupted.
        3. Store `task` as the model's active task -> created.
        All in one transaction.
        """
        check_new(task)

        def create(db: sqlite3.Connection) -> tuple[LoadTask, bool]:
            row = db.execute(
                "SELECT record FROM load_tasks WHERE active = 1 AND runner_id = ? AND model_id = ?"
                " ORDER BY created_at LIMIT 1",
                (task.runner_id, task.model_id),
            ).fetchone()
            if row is not None:
                current = _decode(row[0])
                if not is_stale(current, task.created_at, self._stale_after_s):  # 1
                    return current, False
                now = task.created_at
                self._write(db, current.fail(stale_reason(current, now), now=now))  # 2
            return self._write(db, task), True  # 3

        return await self._run(create)

    async def list_active(self) -> list[LoadTask]:
        rows = await self._run(
            lambda db: db.execute(
                "SELECT record FROM load_tasks WHERE active = 1 ORDER BY created_at"
            ).fetchall()
        )
        return [_decode(raw) for (raw,) in rows]

    async def mark_interrupted(
        self, runner_id: str, reason: str = "runner restarted", *, now: float
    ) -> int:
        mine = [t for t in await self.list_active() if t.runner_id == runner_id]
        return await fail_each(self, (t.fail(interrupted_reason(reason, t), now=now) for t in mine))

    async def aclose(self) -> None:
        self._db.close()
