"""One suite for the task stores (memory, SQLite and a real Redis), plus each store's
specifics.

The `replicas` fixture gives two handles on one store: for memory and SQLite the same
object (one process is one replica), for Redis two stores on two clients, as two runners
would hold.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from runner.tasks.errors import TaskStoreUnavailable
from runner.tasks.record import LoadTask
from runner.tasks.redis_store import RedisTaskStore
from runner.tasks.sqlite_store import SqliteTaskStore
from runner.tasks.state import TaskStatus
from runner.tasks.store import MemoryTaskStore, TaskStore
from tests.support.redis_cluster import redis_url
from tests.support.redis_server import RedisServer

NOW = 1_767_225_600.0
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
STALE_AFTER_S = 600.0


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


Replicas = tuple[TaskStore, TaskStore]


@pytest.fixture(params=["memory", "sqlite", "redis", "cluster"])
async def replicas(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Replicas]:
    if request.param == "memory":
        store = MemoryTaskStore(Clock(), stale_after_s=STALE_AFTER_S)
        yield store, store
        return
    if request.param == "sqlite":
        kept = SqliteTaskStore(tmp_path / "state.sqlite3", Clock(), stale_after_s=STALE_AFTER_S)
        yield kept, kept
        await kept.aclose()
        return
    url = redis_url(request)  # a redis-server, or a three-node cluster
    a = RedisTaskStore.from_url(url, stale_after_s=STALE_AFTER_S)
    b = RedisTaskStore.from_url(url, stale_after_s=STALE_AFTER_S)
    yield a, b
    await a.aclose()
    await b.aclose()


@pytest.fixture
def store(replicas: Replicas) -> TaskStore:
    return replicas[0]


def new(model: str = MODEL, runner: str = "runner-a", now: float = NOW) -> LoadTask:
    return LoadTask.new(model, runner, now=now, eta=60)


async def active(store: TaskStore, runner: str, model: str = MODEL) -> LoadTask | None:
    """The runner's active task for `model`, as `list_active` shows it."""
    found = [t for t in await store.list_active() if (t.runner_id, t.model_id) == (runner, model)]
    assert len(found) <= 1, found
    return found[0] if found else None


async def test_store_put_then_get_roundtrips(store: TaskStore) -> None:
    """A stored task reads back equal, field for field."""
    task = new().start_loading(eta=30, now=NOW + 1).progress_to(0.5, eta=15, now=NOW + 2)
    assert await store.put(task) == task
    assert await store.get(task.task_id) == task


async def test_store_get_unknown_is_none(store: TaskStore) -> None:
    """An id never stored reads as None (the handler's 404)."""
    assert await store.get("load-" + "0" * 32) is None


async def test_store_second_replica_answers_status(replicas: Replicas) -> None:
    """A task written by one replica is read, with its progress, by the other."""
    a, b = replicas
    created, _ = await a.create_or_join(new())
    await a.put(created.start_loading(eta=20, now=NOW + 1).progress_to(0.3, eta=14, now=NOW + 5))
    seen = await b.get(created.task_id)
    assert seen is not None
    assert (seen.status, seen.progress, seen.eta) == (TaskStatus.LOADING, 0.3, 14)
    done = seen.complete(8200, 9000, now=NOW + 9)
    await b.put(done)
    assert await a.get(created.task_id) == done


async def test_store_create_or_join_joins_active_task(replicas: Replicas) -> None:
    """A second load of a model already loading on the same runner joins that task;
    a load of it on another runner gets a task of its own (each replica loads its own)."""
    a, b = replicas
    first, created = await a.create_or_join(new(runner="runner-a"))
    assert created
    joined, created_again = await b.create_or_join(new(runner="runner-a", now=NOW + 3))
    assert not created_again
    assert joined == first
    assert await active(b, "runner-a") == first
    own, created_own = await b.create_or_join(new(runner="runner-b", now=NOW + 4))
    assert created_own and own.task_id != first.task_id
    assert await active(a, "runner-b") == own


async def test_store_create_or_join_race_creates_one(replicas: Replicas) -> None:
    """Forty concurrent loads of one model on one runner, through two store handles, end
    with exactly one task."""
    a, b = replicas
    attempts = [new(runner="runner-a") for _ in range(40)]
    results = await asyncio.gather(
        *((a if i % 2 else b).create_or_join(t) for i, t in enumerate(attempts))
    )
    created = [task for task, was_created in results if was_created]
    assert len(created) == 1
    assert {task.task_id for task, _ in results} == {created[0].task_id}
    assert [t.task_id for t in await a.list_active()] == [created[0].task_id]


async def test_store_create_or_join_after_finish_creates_new(store: TaskStore) -> None:
    """Once the model's task finished, the next load gets a new task."""
    first, _ = await store.create_or_join(new())
    await store.put(first.fail("out of memory", now=NOW + 1))
    second, created = await store.create_or_join(new(now=NOW + 2))
    assert created
    assert second.task_id != first.task_id
    assert await active(store, "runner-a") == second


async def test_store_create_or_join_other_models_are_independent(store: TaskStore) -> None:
    """Loads of different models each create their own task."""
    _, a_created = await store.create_or_join(new("org/a"))
    _, b_created = await store.create_or_join(new("org/b"))
    assert a_created and b_created
    assert {t.model_id for t in await store.list_active()} == {"org/a", "org/b"}


async def test_store_create_or_join_replaces_stale_task(replicas: Replicas) -> None:
    """A task silent for longer than stale_after_s is failed as interrupted, not joined."""
    a, b = replicas
    dead, _ = await a.create_or_join(new(runner="runner-gone"))
    later = NOW + STALE_AFTER_S + 1
    fresh, created = await b.create_or_join(new(runner="runner-gone", now=later))
    assert created
    assert fresh.task_id != dead.task_id
    old = await a.get(dead.task_id)
    assert old is not None and old.status is TaskStatus.FAILED
    assert old.error is not None
    assert old.error.startswith("interrupted: runner 'runner-gone' stopped reporting")
    assert old.error.endswith("while the task was queued")


async def test_store_create_or_join_joins_task_written_recently(store: TaskStore) -> None:
    """A long load that keeps writing progress is joined, however old it is."""
    task, _ = await store.create_or_join(new())
    beat = NOW + 5 * STALE_AFTER_S
    await store.put(task.start_loading(eta=9, now=beat))
    joined, created = await store.create_or_join(new(now=beat + STALE_AFTER_S - 1))
    assert not created
    assert joined.task_id == task.task_id


async def test_store_create_or_join_refuses_finished_task(store: TaskStore) -> None:
    """create_or_join takes only an active task: a finished one is a caller's mistake."""
    with pytest.raises(ValueError):
        await store.create_or_join(new().fail("x", now=NOW))


async def test_store_active_task_follows_lifecycle(store: TaskStore) -> None:
    """list_active shows the task while it runs and forgets it once it finishes."""
    assert await active(store, "runner-a") is None
    task, _ = await store.create_or_join(new())
    loading = task.start_loading(eta=9, now=NOW + 1)
    await store.put(loading)
    assert await active(store, "runner-a") == loading
    await store.put(loading.complete(100, 2000, now=NOW + 2))
    assert await active(store, "runner-a") is None


async def test_store_list_active_excludes_finished(store: TaskStore) -> None:
    """list_active lists running tasks oldest first, and no finished one."""
    a, _ = await store.create_or_join(new("org/a", now=NOW))
    b, _ = await store.create_or_join(new("org/b", now=NOW + 1))
    c, _ = await store.create_or_join(new("org/c", now=NOW + 2))
    await store.put(b.cancel(now=NOW + 3))
    assert [t.task_id for t in await store.list_active()] == [a.task_id, c.task_id]


async def test_store_put_refuses_stale_write_after_cancel(replicas: Replicas) -> None:
    """A loader's late progress write cannot undo a cancel; put returns the cancelled record."""
    a, b = replicas
    task, _ = await a.create_or_join(new())
    loading = task.start_loading(eta=9, now=NOW + 1)
    await a.put(loading)
    cancelled = loading.cancel(now=NOW + 2, reason="cancelled by operator")
    await b.put(cancelled)
    answer = await a.put(loading.progress_to(0.9, eta=1, now=NOW + 3))
    assert answer == cancelled
    assert await a.get(task.task_id) == cancelled
    assert await active(a, "runner-a") is None


async def test_store_put_refuses_backwards_move(store: TaskStore) -> None:
    """A stale `downloading` write does not overwrite a stored `loading` record."""
    task, _ = await store.create_or_join(new())
    downloading = task.start_download(eta=9, now=NOW + 1)
    loading = downloading.start_loading(eta=5, now=NOW + 2)
    await store.put(loading)
    assert await store.put(downloading) == loading


async def test_store_put_accepts_a_skipped_step(store: TaskStore) -> None:
    """A fast load may write queued, then completed: the skipped `loading` is not required."""
    task, _ = await store.create_or_join(new())
    done = task.start_loading(eta=1, now=NOW + 1).complete(512, 900, now=NOW + 2)
    assert await store.put(done) == done
    assert await store.get(task.task_id) == done
    assert await store.list_active() == []


async def test_store_progress_updates_overwrite(store: TaskStore) -> None:
    """Writes within one status (progress) replace each other."""
    task, _ = await store.create_or_join(new())
    loading = task.start_loading(eta=9, now=NOW + 1)
    for i in range(1, 4):
        step = loading.progress_to(i / 4, eta=9 - i, now=NOW + 1 + i)
        assert await store.put(step) == step
    stored = await store.get(task.task_id)
    assert stored is not None and stored.progress == 0.75


async def test_store_mark_interrupted_only_this_runners_active_tasks(replicas: Replicas) -> None:
    """At restart, this runner's running tasks read failed with the reason; others untouched."""
    a, b = replicas
    mine_q, _ = await a.create_or_join(new("org/q", runner="runner-a"))
    mine_l, _ = await a.create_or_join(new("org/l", runner="runner-a"))
    await a.put(mine_l.start_loading(eta=9, now=NOW + 1))
    mine_done, _ = await a.create_or_join(new("org/done", runner="runner-a"))
    done = mine_done.start_loading(eta=1, now=NOW + 1).complete(10, 10, now=NOW + 2)
    await a.put(done)
    theirs, _ = await b.create_or_join(new("org/theirs", runner="runner-b"))

    assert await a.mark_interrupted("runner-a", now=NOW + 10) == 2

    q = await b.get(mine_q.task_id)
    loading = await b.get(mine_l.task_id)
    assert q is not None and loading is not None
    assert (q.status, q.error) == (
        TaskStatus.FAILED,
        "interrupted: runner restarted while the task was queued",
    )
    assert (loading.status, loading.error) == (
        TaskStatus.FAILED,
        "interrupted: runner restarted while the task was loading",
    )
    assert loading.updated_at == NOW + 10
    assert await b.get(mine_done.task_id) == done
    assert await b.get(theirs.task_id) == theirs
    assert [t.task_id for t in await b.list_active()] == [theirs.task_id]
    assert await a.mark_interrupted("runner-a", now=NOW + 11) == 0


async def test_store_mark_interrupted_uses_given_reason(store: TaskStore) -> None:
    """The reason words the failure: `interrupted: <reason> while the task was <status>`."""
    task, _ = await store.create_or_join(new())
    await store.mark_interrupted("runner-a", "runner drained", now=NOW + 1)
    stored = await store.get(task.task_id)
    assert stored is not None
    assert stored.error == "interrupted: runner drained while the task was queued"


async def test_memory_store_finished_task_expires_after_retention() -> None:
    """A finished task reads back until retention_s has passed on the clock, then is gone."""
    clock = Clock()
    store = MemoryTaskStore(clock, retention_s=3600)
    task, _ = await store.create_or_join(new())
    done = task.start_loading(eta=1, now=NOW).complete(1, 1, now=NOW + 1)
    await store.put(done)
    clock.advance(3599.999)
    assert await store.get(task.task_id) == done
    clock.advance(0.001)
    assert await store.get(task.task_id) is None
    assert len(store) == 0


async def test_memory_store_active_task_never_expires() -> None:
    """A running task stays however long the clock runs (only its runner may fail it)."""
    clock = Clock()
    store = MemoryTaskStore(clock, retention_s=60)
    task, _ = await store.create_or_join(new())
    clock.advance(10 * 86_400)
    assert await store.get(task.task_id) == task
    assert len(store) == 1


async def test_memory_store_retention_counts_from_the_last_write() -> None:
    """A task finished, then re-written in the same status, keeps the later deadline."""
    clock = Clock()
    store = MemoryTaskStore(clock, retention_s=100)
    task, _ = await store.create_or_join(new())
    failed = task.fail("x", now=NOW)
    await store.put(failed)
    clock.advance(60)
    await store.put(failed)
    clock.advance(60)
    assert await store.get(task.task_id) == failed


async def test_sqlite_store_finished_task_expires_after_retention(tmp_path: Path) -> None:
    """A finished task in the file reads back until retention_s has passed, then is gone."""
    clock = Clock()
    store = SqliteTaskStore(tmp_path / "state.sqlite3", clock, retention_s=3600)
    task, _ = await store.create_or_join(new())
    done = task.start_loading(eta=1, now=NOW).complete(1, 1, now=NOW + 1)
    await store.put(done)
    clock.advance(3599.999)
    assert await store.get(task.task_id) == done
    clock.advance(0.001)
    assert await store.get(task.task_id) is None
    await store.aclose()


async def test_sqlite_store_restart_keeps_tasks_and_fails_the_active_ones(tmp_path: Path) -> None:
    """A store opened again on the file (the runner restarted) reads the finished task and
    fails the runner's active one as interrupted, as the start-up does."""
    clock = Clock()
    path = tmp_path / "state.sqlite3"
    first = SqliteTaskStore(path, clock)
    running, _ = await first.create_or_join(new())
    other, _ = await first.create_or_join(new("other/model"))
    done = other.start_loading(eta=1, now=NOW).complete(1, 1, now=NOW + 1)
    await first.put(done)
    await first.aclose()
    second = SqliteTaskStore(path, clock)
    assert await second.get(other.task_id) == done
    assert await second.mark_interrupted("runner-a", now=NOW + 5) == 1
    failed = await second.get(running.task_id)
    assert failed is not None and failed.status is TaskStatus.FAILED
    assert await second.list_active() == []
    await second.aclose()


async def test_sqlite_store_failure_is_unavailable(tmp_path: Path) -> None:
    """A store whose file can no longer be used raises TaskStoreUnavailable (503)."""
    store = SqliteTaskStore(tmp_path / "state.sqlite3", Clock())
    await store.aclose()
    with pytest.raises(TaskStoreUnavailable):
        await store.get("anything")


async def test_redis_store_finished_task_has_retention_ttl(redis_server: RedisServer) -> None:
    """A finished task's key carries the retention ttl; a running one has none."""
    store = RedisTaskStore.from_url(redis_server.url, retention_s=7200)
    client = aioredis.Redis.from_url(redis_server.url)
    task, _ = await store.create_or_join(new())
    assert await client.ttl(store.task_key(task.task_id)) == -1
    await store.put(task.fail("x", now=NOW))
    assert 7000 < await client.ttl(store.task_key(task.task_id)) <= 7200
    assert await client.exists(store.model_key("runner-a", MODEL)) == 0
    assert await client.smembers(store.active_key) == set()
    await client.aclose()
    await store.aclose()


async def test_redis_store_keys_use_the_prefix(redis_server: RedisServer) -> None:
    """Every key the store writes starts with its prefix."""
    store = RedisTaskStore.from_url(redis_server.url, "t1:")
    client = aioredis.Redis.from_url(redis_server.url)
    await store.create_or_join(new())
    keys = {k.decode() if isinstance(k, bytes) else k for k in await client.keys("*")}
    assert keys and all(k.startswith("t1:") for k in keys)
    assert "t1:active" in keys and f"t1:model:runner-a:{MODEL}" in keys
    await client.aclose()
    await store.aclose()


async def test_redis_store_list_active_prunes_vanished_ids(redis_server: RedisServer) -> None:
    """An active-set entry whose record was deleted is dropped from the set, not listed."""
    store = RedisTaskStore.from_url(redis_server.url)
    client = aioredis.Redis.from_url(redis_server.url)
    task, _ = await store.create_or_join(new())
    await client.delete(store.task_key(task.task_id))
    assert await store.list_active() == []
    assert await client.smembers(store.active_key) == set()
    fresh, created = await store.create_or_join(new(now=NOW + 1))
    assert created and fresh.task_id != task.task_id
    await client.aclose()
    await store.aclose()


async def test_redis_store_unreachable_is_unavailable(redis_server: RedisServer) -> None:
    """With Redis stopped every operation raises TaskStoreUnavailable (503), never a guess."""
    store = RedisTaskStore.from_url(redis_server.url, timeout_s=1.0)
    task = new()
    redis_server.stop()
    with pytest.raises(TaskStoreUnavailable) as info:
        await store.get(task.task_id)
    assert info.value.status == 503
    with pytest.raises(TaskStoreUnavailable):
        await store.put(task)
    with pytest.raises(TaskStoreUnavailable):
        await store.create_or_join(task)
    with pytest.raises(TaskStoreUnavailable):
        await store.list_active()
    with pytest.raises(TaskStoreUnavailable):
        await store.mark_interrupted("runner-a", now=NOW)
    await store.aclose()


def test_redis_store_refuses_zero_retention() -> None:
    """A retention under one second is a configuration mistake, refused at construction."""
    with pytest.raises(ValueError):
        RedisTaskStore.from_url("redis://127.0.0.1:1/0", retention_s=0)
