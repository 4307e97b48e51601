"""The load tasks' store the settings ask for: Redis (`REDIS_URL`, every replica's), else
SQLite (`STATE_DB`: a restart keeps them), else memory (`STATE_DB=memory`)."""

from __future__ import annotations

import time

from runner.floor.settings import Settings
from runner.tasks.redis_store import RedisTaskStore
from runner.tasks.sqlite_store import SqliteTaskStore
from runner.tasks.store import MemoryTaskStore, TaskStore


def task_store_for(s: Settings) -> TaskStore:
    if s.redis_url:
        return RedisTaskStore.from_url(s.redis_url)
    state_db = s.state_db_path
    return (
        SqliteTaskStore(state_db, time.time, sync=s.state_db_sync)
        if state_db
        else MemoryTaskStore(time.time)
    )
