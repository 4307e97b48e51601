"""Job stores: where job records live so that any replica can answer `GET /v1/jobs/{id}`.

Storage only; what a job may become is decided in `record.py`, when in `manager.py`.

Each job is written by one writer, the runner that owns it (`runner_id`); other
replicas only *ask* for a cancel, which is a separate flag (`request_cancel`)
so it can never overwrite the owner's record. Finished jobs are kept for
`retention_s`, unfinished ones for `active_ttl_s` after their last write (a
job whose runner never comes back does not stay forever). Each store also keeps
the ids of every runner's unfinished jobs, so a restarted runner can find and
fail the jobs it was running (`mark_interrupted`).

Redis layout (`prefix` = `quorum:job:`)::

    quorum:job:<id>             the job's record, JSON (record.encode), with a TTL
    quorum:job:<id>:cancel      "1" while a cancel was asked for on another replica
    quorum:job:runner:<runner>  set of that runner's unfinished job ids

On a Redis Cluster the prefix is `{quorum:job}:` (a hash tag: a job's record, its cancel
flag and its runner's set are written in one MULTI, so they share one slot).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Protocol

import redis.asyncio as aioredis

from faults.redis_clients import one_slot, redis_client
from runner.jobs import record
from runner.jobs.errors import redis_errors
from runner.jobs.record import Failure, Job

Clock = Callable[[], float]

DEFAULT_RETENTION_S = 24 * 3600
DEFAULT_ACTIVE_TTL_S = 7 * 24 * 3600
INTERRUPTED_CODE = "job_interrupted"


class JobStore(Protocol):
    async def put(self, job: Job) -> None:
        """Write the job's whole record (create or replace)."""
        ...

    async def get(self, job_id: str) -> Job | None:
        """The record, or None when unknown or expired."""
        ...

    async def request_cancel(self, job_id: str) -> None:
        """Ask the owning runner to cancel the job (it notices on its next progress write)."""
        ...

    async def cancel_requested(self, job_id: str) -> bool: ...

    async def mark_interrupted(self, runner_id: str, reason: str, now: float) -> list[Job]:
        """Fail every unfinished job of `runner_id` with `reason`; return them as written."""
        ...

    async def aclose(self) -> None: ...


def ttl_of(job: Job, retention_s: int, active_ttl_s: int) -> int:
    return retention_s if job.terminal else active_ttl_s


def check_ttls(retention_s: int, active_ttl_s: int) -> None:
    if retention_s < 1 or active_ttl_s < 1:
        raise ValueError("retention_s and active_ttl_s must be at least 1 second")


def interrupted(job: Job, reason: str, now: float) -> Job:
    return record.fail(job, Failure(INTERRUPTED_CODE, reason), now)


class MemoryJobStore:
    """One process's jobs, expired by the injected clock (single replica only)."""

    def __init__(
        self,
        clock: Clock,
        retention_s: int = DEFAULT_RETENTION_S,
        active_ttl_s: int = DEFAULT_ACTIVE_TTL_S,
    ) -> None:
        check_ttls(retention_s, active_ttl_s)
        self._clock = clock
        self._retention_s = retention_s
        self._active_ttl_s = active_ttl_s
        self._jobs: dict[str, tuple[Job, float]] = {}
        self._heap: list[tuple[float, str]] = []
        self._cancels: set[str] = set()

    def __len__(self) -> int:
        self._purge(self._clock())
        return len(self._jobs)

    async def put(self, job: Job) -> None:
        now = self._clock()
        self._purge(now)
        deadline = now + ttl_of(job, self._retention_s, self._active_ttl_s)
        self._jobs[job.id] = (job, deadline)
        heapq.heappush(self._heap, (deadline, job.id))
        if job.terminal:
            self._cancels.discard(job.id)

    async def get(self, job_id: str) -> Job | None:
        self._purge(self._clock())
        held = self._jobs.get(job_id)
        return None if held is None else held[0]

    async def request_cancel(self, job_id: str) -> None:
        if job_id in self._jobs:
            self._cancels.add(job_id)

    async def cancel_requested(self, job_id: str) -> bool:
        return job_id in self._cancels

    async def mark_interrupted(self, runner_id: str, reason: str, now: float) -> list[Job]:
        self._purge(self._clock())
        failed = [
            interrupted(job, reason, now)
            for job, _ in self._jobs.values()
            if job.runner_id == runner_id and not job.terminal
        ]
        for job in failed:
            await self.put(job)
        return failed

    async def aclose(self) -> None:
        return None

    def _purge(self, now: float) -> None:
        while self._heap and self._heap[0][0] <= now:
            deadline, job_id = heapq.heappop(self._heap)
            held = self._jobs.get(job_id)
            if held is not None and held[1] == deadline:
                del self._jobs[job_id]
                self._cancels.discard(job_id)


class RedisJobStore:
    """Jobs shared by every replica, one JSON value per job in Redis."""

    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str = "quorum:job:",
        retention_s: int = DEFAULT_RETENTION_S,
        active_ttl_s: int = DEFAULT_ACTIVE_TTL_S,
    ) -> None:
        check_ttls(retention_s, active_ttl_s)
        self._client = client
        self._prefix = prefix
        self._retention_s = retention_s
        self._active_ttl_s = active_ttl_s

    @classmethod
    def from_url(
        cls,
        url: str,
        timeout_s: float = 2.0,
        retention_s: int = DEFAULT_RETENTION_S,
        active_ttl_s: int = DEFAULT_ACTIVE_TTL_S,
    ) -> RedisJobStore:
        client = redis_client(url, timeout_s)
        prefix = one_slot(url, "quorum:job:")  # a job, its cancel and its runner's set: one MULTI
        return cls(client, prefix, retention_s=retention_s, active_ttl_s=active_ttl_s)

    def key(self, job_id: str) -> str:
        return self._prefix + job_id

    def _cancel_key(self, job_id: str) -> str:
        return self._prefix + job_id + ":cancel"

    def _runner_key(self, runner_id: str) -> str:
        return self._prefix + "runner:" + runner_id

    async def put(self, job: Job) -> None:
        ttl = ttl_of(job, self._retention_s, self._active_ttl_s)
        with redis_errors("writing a job"):
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.set(self.key(job.id), record.encode(job), ex=ttl)
                if job.terminal:
                    pipe.srem(self._runner_key(job.runner_id), job.id)
                    pipe.delete(self._cancel_key(job.id))
                else:
                    pipe.sadd(self._runner_key(job.runner_id), job.id)
                await pipe.execute()

    async def get(self, job_id: str) -> Job | None:
        with redis_errors("reading a job"):
            raw = await self._client.get(self.key(job_id))
        return None if raw is None else record.decode(raw)

    async def request_cancel(self, job_id: str) -> None:
        with redis_errors("asking for a cancel"):
            await self._client.set(self._cancel_key(job_id), b"1", ex=self._active_ttl_s)

    async def cancel_requested(self, job_id: str) -> bool:
        with redis_errors("reading a cancel request"):
            return bool(await self._client.exists(self._cancel_key(job_id)))

    async def mark_interrupted(self, runner_id: str, reason: str, now: float) -> list[Job]:
        runner_key = self._runner_key(runner_id)
        with redis_errors("finding interrupted jobs"):
            members = await self._client.smembers(runner_key)
            ids = sorted(m.decode() if isinstance(m, bytes) else m for m in members)
            raws = await self._client.mget([self.key(i) for i in ids]) if ids else []
        failed: list[Job] = []
        gone: list[str] = []
        for job_id, raw in zip(ids, raws, strict=True):
            job = None if raw is None else record.decode(raw)
            if job is None or job.terminal or job.runner_id != runner_id:
                gone.append(job_id)
            else:
                failed.append(interrupted(job, reason, now))
        for job in failed:
            await self.put(job)
        if gone:
            with redis_errors("cleaning the runner's job set"):
                await self._client.srem(runner_key, *gone)
        return failed

    async def aclose(self) -> None:
        await self._client.aclose()
