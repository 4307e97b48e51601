"""Writes a shared store refused while it was down, written again once it is back.

A load task or a job is written by its owner only, and the owner's copy in memory is the
truth: when the store (Redis) is unreachable, a write fails, the work goes on, and the
record in the store keeps its last state. Usually the next write carries the whole
record; but the last write (completed, succeeded, failed) has no next one, and a load
or job that ended during an outage would read unfinished forever. So each failed write
is kept here, the latest per record, and tried again every `retry_s` until the store
takes it or a later write of the same record succeeds.

Writes of one record are serialized (`write` and the retries hold the record's lock),
so a retry never lands after a later write and undoes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

log = logging.getLogger("quorum.stores")

Record = TypeVar("Record")
Stored = TypeVar("Stored")

RETRY_S = 1.0


class PendingWrites(Generic[Record, Stored]):
    """`write(key, record)` puts a record through `put`; a put that raises `unavailable`
    is kept and retried every `retry_s` in one background task, until it succeeds."""

    def __init__(
        self,
        put: Callable[[Record], Awaitable[Stored]],
        unavailable: type[Exception],
        what: str,
        *,
        retry_s: float = RETRY_S,
    ) -> None:
        self._put = put
        self._unavailable = unavailable
        self._what = what
        self._retry_s = retry_s
        self._pending: dict[str, Record] = {}
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._retrying: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._pending)

    async def write(self, key: str, record: Record) -> Stored | None:
        """What the store answered, or None when it is down (the record is kept and
        written when it is back)."""
        lock = self._lock(key)
        async with lock:
            try:
                stored = await self._put(record)
            except self._unavailable as exc:
                if key not in self._pending:
                    log.warning(
                        "%s %s not written, kept until the store is back: %s", self._what, key, exc
                    )
                self._pending[key] = record
                self._retry_soon()
                return None
            self._pending.pop(key, None)
            return stored

    async def aclose(self) -> None:
        """Stop retrying; what is still pending is dropped (a restarted runner marks its
        unfinished records interrupted)."""
        if self._retrying is not None:
            self._retrying.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retrying
        if self._pending:
            log.warning("%d %s write(s) dropped at shutdown", len(self._pending), self._what)

    def _lock(self, key: str) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[key] = lock
        return lock

    def _retry_soon(self) -> None:
        if self._retrying is None or self._retrying.done():
            self._retrying = asyncio.get_running_loop().create_task(
                self._retry(), name=f"pending {self._what} writes"
            )

    async def _retry(self) -> None:
        while self._pending:
            await asyncio.sleep(self._retry_s)
            for key in list(self._pending):
                lock = self._lock(key)
                async with lock:
                    record = self._pending.get(key)
                    if record is None:  # a later write got through meanwhile
                        continue
                    try:
                        await self._put(record)
                    except self._unavailable:
                        break  # still down: every record waits for the next round
                    del self._pending[key]
        log.info("%s writes caught up: the store has every record again", self._what)
