"""How every embedded store of state that must outlive the process opens `STATE_DB` (one
SQLite file: spent nonces, governed tenant policies, load tasks, jobs), in one place, so
that all of them promise the same durability.

- WAL journal: readers never wait for the writer; a write is one append to the log.
- `synchronous=FULL` (`STATE_DB_SYNC=full`, the default): the log is fsynced at each
  commit, so a write that returned (a nonce spent before the 200, a policy stored) is on
  disk: a SIGKILL loses nothing, and a power cut or an OS crash loses nothing either, on
  storage that honours fsync (a disk or volume that lies about its write cache may lose
  the last commits). Each commit costs one fsync of the disk.
- `synchronous=NORMAL` (`STATE_DB_SYNC=normal`): a commit is written to the log but not
  fsynced (the log is fsynced at checkpoints): a SIGKILL or a crash of the runner still
  loses nothing (the OS holds the write), a power cut or an OS crash may lose the last
  commits (a spent nonce may be spendable again, inside its validity window).
- One connection per store, its calls serialized by a lock and run in a worker thread
  (`run`): a store's caller awaits, the event loop never blocks on the disk.

Each store translates `sqlite3.Error` into its own package's "store unavailable" error.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

MEMORY = "memory"
"""`STATE_DB=memory`: no file; the stores keep their state in the process (lost at exit)."""


SYNC_MODES = ("full", "normal")


def open_state_db(path: str | Path, sync: str = "full") -> sqlite3.Connection:
    """A connection to the file at `path` (its folder made), in WAL mode, with `sync`
    (`full` or `normal`) as its synchronous mode."""
    if sync not in SYNC_MODES:
        raise ValueError(f"synchronous mode must be one of {SYNC_MODES}, not {sync!r}")
    file = Path(path).expanduser()
    file.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(file, check_same_thread=False, timeout=10, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={sync.upper()}")
    return db


class StateDb:
    """One connection whose calls run one at a time, in a worker thread, each in one
    `BEGIN IMMEDIATE` transaction (committed when the call returns, rolled back when it
    raises): a read and the write that depends on it hold the file's write lock together,
    even against another process on the same file."""

    def __init__(self, path: str | Path, sync: str = "full") -> None:
        self.path = Path(path).expanduser()
        self._db = open_state_db(self.path, sync)
        self._lock = threading.Lock()
        self._closed = False

    def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` in one transaction, here (start-up and tests)."""
        with self._lock:
            if self._closed:
                raise sqlite3.ProgrammingError(f"state db {self.path} is closed")
            self._db.execute("BEGIN IMMEDIATE")
            try:
                result = fn(self._db)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return result

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` in one transaction, in a worker thread."""
        return await asyncio.to_thread(self.call, fn)

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()
