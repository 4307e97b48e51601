"""One suite for both job stores (memory and a real Redis: the `store` fixture in conftest.py),
plus each store's specifics."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio as aioredis

from runner.jobs import record
from runner.jobs.errors import JobStoreUnavailable
from runner.jobs.record import Failure, JobStatus, Progress
from runner.jobs.sqlite_store import SqliteJobStore
from runner.jobs.store import JobStore, MemoryJobStore, RedisJobStore
from tests.runner.jobs.support import NOW, Clock, queued, running
from tests.support.redis_server import RedisServer


async def test_store_put_then_get(store: JobStore) -> None:
    """A stored job reads back equal, progress and all."""
    job = record.report(running(), Progress(1.0, 4.0), NOW + 2)
    await store.put(job)
    assert await store.get(job.id) == job


async def test_store_unknown_id_is_none(store: JobStore) -> None:
    """An id never stored reads None."""
    assert await store.get("job_missing") is None


async def test_store_put_replaces(store: JobStore) -> None:
    """The last write of a job is what every reader sees."""
    await store.put(queued())
    done = record.succeed(running(), {"text": "x"}, NOW + 5)
    await store.put(done)
    assert await store.get("job_one") == done


async def test_store_cancel_request_flag(store: JobStore) -> None:
    """A cancel request is seen by the owner; finishing the job clears it."""
    await store.put(running())
    assert not await store.cancel_requested("job_one")
    await store.request_cancel("job_one")
    assert await store.cancel_requested("job_one")
    await store.put(record.cancel(running(), NOW + 3))
    assert not await store.cancel_requested("job_one")


async def test_store_mark_interrupted_fails_only_this_runners_unfinished_jobs(
    store: JobStore,
) -> None:
    """Start-up fails runner-a's queued and running jobs; finished and runner-b's stay."""
    mine_running = running("job_a1", "runner-a")
    mine_queued = queued("job_a2", runner_id="runner-a")
    mine_done = record.succeed(running("job_a3", "runner-a"), {"ok": 1}, NOW + 2)
    theirs = running("job_b1", "runner-b")
    for job in (mine_running, mine_queued, mine_done, theirs):
        await store.put(job)

    failed = await store.mark_interrupted("runner-a", "runner restarted", NOW + 10)

    assert sorted(j.id for j in failed) == ["job_a1", "job_a2"]
    for job_id in ("job_a1", "job_a2"):
        got = await store.get(job_id)
        assert got is not None and got.status is JobStatus.FAILED
        assert got.error == Failure("job_interrupted", "runner restarted")
        assert got.finished_at == NOW + 10
    assert await store.get("job_a3") == mine_done
    assert await store.get("job_b1") == theirs
    assert await store.mark_interrupted("runner-a", "again", NOW + 11) == []


async def test_store_mark_interrupted_with_nothing_to_do(store: JobStore) -> None:
    """A runner with no jobs in the store finds none."""
    assert await store.mark_interrupted("runner-z", "restarted", NOW) == []


async def test_store_memory_keeps_finished_jobs_for_retention() -> None:
    """The memory store forgets a finished job exactly retention_s after its last write."""
    clock = Clock()
    store = MemoryJobStore(clock, retention_s=60, active_ttl_s=3600)
    await store.put(record.succeed(running(), None, NOW))
    clock.advance(59.999)
    assert await store.get("job_one") is not None
    clock.advance(0.001)
    assert await store.get("job_one") is None
    assert len(store) == 0


async def test_store_memory_unfinished_jobs_live_for_active_ttl() -> None:
    """An unfinished job outlives the retention and expires after active_ttl_s with no write."""
    clock = Clock()
    store = MemoryJobStore(clock, retention_s=60, active_ttl_s=3600)
    await store.put(running())
    clock.advance(3000)
    await store.put(record.report(running(), Progress(1.0), clock()))  # a write renews it
    clock.advance(3599)
    assert await store.get("job_one") is not None
    clock.advance(1)
    assert await store.get("job_one") is None


async def test_store_sqlite_expires_and_survives_a_reopen(tmp_path: Path) -> None:
    """A store opened again on the file (a restart) reads the jobs, fails the runner's
    unfinished ones, and forgets a finished job retention_s after its last write."""
    clock = Clock()
    path = tmp_path / "state.sqlite3"
    first = SqliteJobStore(path, clock, retention_s=60, active_ttl_s=3600)
    await first.put(running("job_run", "runner-a"))
    done = record.succeed(running("job_done", "runner-a"), None, NOW)
    await first.put(done)
    await first.aclose()
    second = SqliteJobStore(path, clock, retention_s=60, active_ttl_s=3600)
    assert await second.get("job_done") == done
    assert [j.id for j in await second.mark_interrupted("runner-a", "restarted", NOW)] == [
        "job_run"
    ]
    clock.advance(60)
    assert await second.get("job_done") is None
    assert await second.get("job_run") is None  # failed at NOW: its retention too
    await second.aclose()


async def test_store_sqlite_failure_is_unavailable(tmp_path: Path) -> None:
    """A store whose file can no longer be used raises JobStoreUnavailable (503)."""
    store = SqliteJobStore(tmp_path / "state.sqlite3", Clock())
    await store.aclose()
    with pytest.raises(JobStoreUnavailable):
        await store.get("job_one")


async def test_store_redis_ttls(redis_server: RedisServer) -> None:
    """Redis keeps unfinished jobs for active_ttl_s and finished ones for retention_s."""
    store = RedisJobStore.from_url(redis_server.url, retention_s=60, active_ttl_s=3600)
    client = aioredis.Redis.from_url(redis_server.url)
    await store.put(running())
    assert 3500 < await client.ttl(store.key("job_one")) <= 3600
    assert await client.smembers("quorum:job:runner:runner-a") == {b"job_one"}
    await store.put(record.succeed(running(), None, NOW))
    assert 0 < await client.ttl(store.key("job_one")) <= 60
    assert await client.smembers("quorum:job:runner:runner-a") == set()
    await client.aclose()
    await store.aclose()


async def test_store_redis_mark_interrupted_drops_expired_ids(redis_server: RedisServer) -> None:
    """An id left in a runner's set whose record expired is dropped, not failed."""
    store = RedisJobStore.from_url(redis_server.url)
    client = aioredis.Redis.from_url(redis_server.url)
    await store.put(running("job_gone"))
    await client.delete(store.key("job_gone"))
    assert await store.mark_interrupted("runner-a", "restarted", NOW) == []
    assert await client.smembers("quorum:job:runner:runner-a") == set()
    await client.aclose()
    await store.aclose()


async def test_store_redis_unreachable_is_unavailable(redis_server: RedisServer) -> None:
    """With Redis stopped every operation raises JobStoreUnavailable (503, Retry-After)."""
    store = RedisJobStore.from_url(redis_server.url, timeout_s=1.0)
    redis_server.stop()
    for call in (
        store.put(running()),
        store.get("job_one"),
        store.request_cancel("job_one"),
        store.cancel_requested("job_one"),
        store.mark_interrupted("runner-a", "restarted", NOW),
    ):
        with pytest.raises(JobStoreUnavailable) as caught:
            await call
        assert caught.value.status == 503 and caught.value.headers == {"Retry-After": "1"}
    await store.aclose()


def test_store_refuses_zero_ttls() -> None:
    """A retention under one second is a configuration mistake, not a silent no-op."""
    with pytest.raises(ValueError):
        MemoryJobStore(Clock(), retention_s=0)
