"""Jobs in `STATE_DB` (the embedded default), so a restarted runner still answers
`GET /v1/jobs/{id}`: finished jobs until their retention ends, and the jobs it was running
failed as interrupted (`mark_interrupted` at start-up). See `store.py` for what every
store keeps (one suite tests them).

Tables: `jobs(id, runner_id, terminal, expires, record)` (`record`: record.encode;
`expires`: the last write plus the retention, or the active TTL while unfinished) and
`job_cancels(id)` (a cancel asked for). Every call is one transaction in a worker thread
(faults/state_db.py); SQLite failures become `JobStoreUnavailable` (503) in `_run`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from faults.state_db import StateDb
from runner.jobs import record
from runner.jobs.errors import JobStoreUnavailable
from runner.jobs.record import Job
from runner.jobs.store import (
    DEFAULT_ACTIVE_TTL_S,
    DEFAULT_RETENTION_S,
    Clock,
    check_ttls,
    interrupted,
    ttl_of,
)

T = TypeVar("T")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, runner_id TEXT NOT NULL,"
    " terminal INTEGER NOT NULL, expires REAL NOT NULL, record BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS jobs_runner ON jobs (runner_id, terminal)",
    "CREATE TABLE IF NOT EXISTS job_cancels (id TEXT PRIMARY KEY)",
)


class SqliteJobStore:
    """One runner's jobs in a file that outlives it, expired by the injected clock."""

    def __init__(
        self,
        path: str | Path,
        clock: Clock,
        retention_s: int = DEFAULT_RETENTION_S,
        active_ttl_s: int = DEFAULT_ACTIVE_TTL_S,
        sync: str = "full",
    ) -> None:
        check_ttls(retention_s, active_ttl_s)
        self._db = StateDb(path, sync)
        self._clock = clock
        self._retention_s = retention_s
        self._active_ttl_s = active_ttl_s
        self._db.call(lambda db: [db.execute(sql) for sql in _SCHEMA])

    async def _run(self, action: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await self._db.run(fn)
        except sqlite3.Error as exc:
            raise JobStoreUnavailable(
                f"job store failed while {action} ({type(exc).__name__}); retry shortly"
            ) from exc

    def _purge(self, db: sqlite3.Connection, now: float) -> None:
        db.execute(
            "DELETE FROM job_cancels WHERE id IN (SELECT id FROM jobs WHERE expires <= ?)", (now,)
        )
        db.execute("DELETE FROM jobs WHERE expires <= ?", (now,))

    def _write(self, db: sqlite3.Connection, job: Job, now: float) -> None:
        expires = now + ttl_of(job, self._retention_s, self._active_ttl_s)
        db.execute(
            "INSERT INTO jobs (id, runner_id, terminal, expires, record) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET runner_id = excluded.runner_id,"
            " terminal = excluded.terminal, expires = excluded.expires, record = excluded.record",
            (job.id, job.runner_id, int(job.terminal), expires, record.encode(job)),
        )
        if job.terminal:
            db.execute("DELETE FROM job_cancels WHERE id = ?", (job.id,))

    async def put(self, job: Job) -> None:
        def write(db: sqlite3.Connection) -> None:
            now = self._clock()
            self._purge(db, now)
            self._write(db, job, now)

        await self._run("writing a job", write)

    async def get(self, job_id: str) -> Job | None:
        def read(db: sqlite3.Connection) -> Job | None:
            row = db.execute(
                "SELECT record FROM jobs WHERE id = ? AND expires > ?", (job_id, self._clock())
            ).fetchone()
            return None if row is None else record.decode(row[0])

        return await self._run("reading a job", read)

    async def request_cancel(self, job_id: str) -> None:
        await self._run(
            "asking for a cancel",
            lambda db: db.execute(
                "INSERT OR IGNORE INTO job_cancels (id) SELECT id FROM jobs WHERE id = ?",
                (job_id,),
            ),
        )

    async def cancel_requested(self, job_id: str) -> bool:
        row = await self._run(
            "reading a cancel request",
            lambda db: db.execute("SELECT 1 FROM job_cancels WHERE id = ?", (job_id,)).fetchone(),
        )
        return row is not None

    async def mark_interrupted(self, runner_id: str, reason: str, now: float) -> list[Job]:
        def fail(db: sqlite3.Connection) -> list[Job]:
            clock_now = self._clock()
            self._purge(db, clock_now)
            rows = db.execute(
                "SELECT record FROM jobs WHERE runner_id = ? AND terminal = 0 ORDER BY id",
                (runner_id,),
            ).fetchall()
            failed = [interrupted(record.decode(raw), reason, now) for (raw,) in rows]
            for job in failed:
                self._write(db, job, clock_now)
            return failed

        return await self._run("finding interrupted jobs", fail)

    async def aclose(self) -> None:
        self._db.close()
