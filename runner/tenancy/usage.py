"""The usage recorder: counts per tenant, model and UTC hour as requests end, flushed to
the usage store (`tenants/usage_store.py`) every `flush_s` and at shutdown, so the data
path never waits on a disk or Redis. A replica killed outright loses at most its last
`flush_s` of counts.

Bounded: at most `max_keys` (tenant, model) pairs per hour are kept apart; the rest of
that hour is counted under the tenant `_other`. Hours older than the retention are pruned
(SQLite) or expire (Redis).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from tenants.usage import HOUR, Counts, Key, hour_of, outcome
from tenants.usage_store import UsageStore, UsageStoreUnavailable

log = logging.getLogger("quorum.tenancy.usage")

OTHER = "_other"


class UsageRecorder:
    def __init__(
        self,
        store: UsageStore,
        *,
        retention_s: int,
        flush_s: float = 1.0,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.retention_s = retention_s
        self.flush_s = flush_s
        self.max_keys = max_keys
        self._clock = clock
        self._pending: dict[Key, Counts] = {}
        self._seen: dict[int, set[tuple[str, str]]] = {}  # hour -> pairs kept apart
        self._task: asyncio.Task[None] | None = None
        self._pruned_at = 0.0

    def _counts(self, tenant: str, model: str) -> Counts:
        hour = hour_of(self._clock())
        pairs = self._seen.get(hour)
        if pairs is None:
            self._seen = {h: p for h, p in self._seen.items() if h >= hour - HOUR}
            pairs = self._seen[hour] = set()
        if (tenant, model) not in pairs:
            if len(pairs) >= self.max_keys:
                tenant = OTHER
            pairs.add((tenant, model))
        key = (hour, tenant, model)
        counts = self._pending.get(key)
        if counts is None:
            counts = self._pending[key] = Counts()
        return counts

    def request(
        self,
        tenant: str,
        model: str,
        status: int,
        *,
        prompt: int = 0,
        completion: int = 0,
        cached: int = 0,
        engine_ms: int = 0,
        queue_ms: int = 0,
    ) -> None:
        """One request ended with `status` (the model it named; `_unknown` if none)."""
        c = self._counts(tenant, model)
        c.requests += 1
        kind = outcome(status)
        setattr(c, kind, getattr(c, kind) + 1)
        c.prompt_tokens += prompt
        c.completion_tokens += completion
        c.cached_tokens += cached
        c.engine_seconds += engine_ms / 1000
        c.queue_seconds += queue_ms / 1000

    def images(self, model: str, tenant: str, images: int) -> None:
        self._counts(tenant, model).images += images

    def audio(self, model: str, tenant: str, seconds: float) -> None:
        self._counts(tenant, model).audio_seconds += seconds

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def flush(self) -> None:
        """Write what is pending now (a failed write is kept for the next flush)."""
        batch, self._pending = self._pending, {}
        try:
            await self.store.add(batch)
        except UsageStoreUnavailable as exc:
            log.warning("usage not written yet (%s); kept for the next flush", exc)
            for key, counts in batch.items():
                self._pending.setdefault(key, Counts()).add(counts)
        now = self._clock()
        if now - self._pruned_at > HOUR:
            self._pruned_at = now
            with contextlib.suppress(UsageStoreUnavailable):
                await self.store.prune(hour_of(now) - self.retention_s)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_s)
            try:
                await self.flush()
            except Exception:  # never let the loop die
                log.exception("usage flush failed")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush()
        await self.store.aclose()
