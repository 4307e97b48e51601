"""Cross-replica in-flight caps: the scheduler's `PermitEffects` over the Redis semaphore
(`tenants/permit_store.py`).

`want_permit(tenant)` (from inside the scheduler, never awaiting) starts one try to take a
permit; a permit taken is handed to the scheduler as `PermitGranted`. A try that finds the
cap full waits for a permit to be freed anywhere (`quorum:inflight:freed`, published on
every release) or, at the latest, `retry_s`, then tries again, as long as the scheduler
still wants one. `release_permit(tenant)` gives one back. Permits held are renewed every
`ttl_s / 3`, so a replica that dies frees its permits after `ttl_s`.

Redis unreachable: a capped tenant's requests wait (they are not granted without a
permit) until Redis is back or their queue timeout passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from redis.exceptions import RedisError

from faults.redis_clients import ready, redis_client
from tenants.permit_store import FREED, PermitStoreUnavailable, RedisPermitStore

log = logging.getLogger("quorum.tenancy.permits")


class SharedPermits:
    def __init__(
        self,
        store: RedisPermitStore,
        url: str,
        replica: str,
        cap_of: Callable[[str], int | None],
        *,
        ttl_s: float = 30.0,
        retry_s: float = 0.5,
    ) -> None:
        self.store = store
        self._url = url
        self._replica = replica
        self._cap_of = cap_of
        self._ttl_s = ttl_s
        self._retry_s = retry_s
        self._granted: Callable[[str], None] = lambda _tenant: None
        self._held: dict[str, list[str]] = {}
        self._wanted: set[str] = set()
        self._trying: set[str] = set()
        self._ids = itertools.count(1)
        self._freed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loops: list[asyncio.Task[None]] = []

    def start(self, granted: Callable[[str], None]) -> None:
        """`granted(tenant)` posts `PermitGranted` to the scheduler."""
        self._granted = granted
        loop = asyncio.get_running_loop()
        self._loops = [loop.create_task(self._listen()), loop.create_task(self._renew())]

    # -- PermitEffects ---------------------------------------------------------------

    def want_permit(self, tenant: str) -> None:
        self._wanted.add(tenant)
        if tenant not in self._trying:
            self._spawn(self._take(tenant))

    def release_permit(self, tenant: str) -> None:
        held = self._held.get(tenant)
        if not held:
            return
        holder = held.pop()
        self._spawn(self._release(tenant, holder))

    # -- the work ----------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _take(self, tenant: str) -> None:
        """Try until a permit is taken or nobody wants one any more."""
        self._trying.add(tenant)
        try:
            while tenant in self._wanted:
                cap = self._cap_of(tenant)
                if cap is None:
                    self._wanted.discard(tenant)
                    self._granted(tenant)  # no cap any more: the scheduler will not use it
                    continue
                holder = f"{self._replica}:{next(self._ids)}"
                try:
                    taken = await self.store.acquire(tenant, cap, holder, self._ttl_s)
                except PermitStoreUnavailable as exc:
                    log.warning("in-flight permits unreachable (%s); retrying", exc)
                    taken = False
                if taken:
                    self._held.setdefault(tenant, []).append(holder)
                    self._wanted.discard(tenant)
                    self._granted(tenant)  # the scheduler may want the next one at once
                    continue
                self._freed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._freed.wait(), self._retry_s)
        finally:
            self._trying.discard(tenant)

    async def _release(self, tenant: str, holder: str) -> None:
        try:
            await self.store.release(tenant, holder)
        except PermitStoreUnavailable as exc:  # it expires after ttl_s
            log.warning("a permit of %s was not released (%s); it expires", tenant, exc)

    async def _listen(self) -> None:
        while True:
            client = redis_client(self._url, 5.0)
            try:
                await ready(client)
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(FREED)
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            self._freed.set()
            except (RedisError, OSError) as exc:
                log.warning("permit notifications lost (%s); retrying in 1 s", exc)
                await asyncio.sleep(1.0)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await client.aclose()

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self._ttl_s / 3)
            for tenant, holders in list(self._held.items()):
                with contextlib.suppress(PermitStoreUnavailable):
                    await self.store.renew(tenant, list(holders), self._ttl_s)

    def held(self) -> dict[str, int]:
        return {t: len(h) for t, h in self._held.items() if h}

    async def aclose(self) -> None:
        for task in [*self._loops, *self._tasks]:
            task.cancel()
        for task in [*self._loops, *self._tasks]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for tenant, holders in self._held.items():
            for holder in holders:
                with contextlib.suppress(PermitStoreUnavailable):
                    await self.store.release(tenant, holder)
        await self.store.aclose()
