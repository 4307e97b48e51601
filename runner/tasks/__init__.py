"""Asynchronous model-load tasks: their state machine, record, stores and ETA.

`state.py` (the status enum and its one transition table), `record.py` (`LoadTask`, a
frozen record whose methods return the next record), `store.py` (the `TaskStore`
protocol and `MemoryTaskStore`), `sqlite_store.py` (`SqliteTaskStore`, in STATE_DB),
`redis_store.py` (`RedisTaskStore`, shared by replicas), `build.py` (the one the
settings ask for), `eta.py` (load-time prediction), `errors.py` (the exception tree).
"""

from runner.tasks.errors import (
    IllegalTaskTransition,
    TaskError,
    TaskNotCancellable,
    TaskNotFound,
    TaskStoreUnavailable,
)
from runner.tasks.eta import (
    EtaEstimator,
    LoadSample,
    LoadSpeed,
    download_progress,
    eta_remaining,
    fit_load_speed,
    synthetic_progress,
)
from runner.tasks.record import LoadTask, new_task_id
from runner.tasks.redis_store import RedisTaskStore
from runner.tasks.sqlite_store import SqliteTaskStore
from runner.tasks.state import TaskStatus, assert_transition, can_transition
from runner.tasks.store import MemoryTaskStore, TaskStore

__all__ = [
    "EtaEstimator",
    "IllegalTaskTransition",
    "LoadSample",
    "LoadSpeed",
    "LoadTask",
    "MemoryTaskStore",
    "RedisTaskStore",
    "SqliteTaskStore",
    "TaskError",
    "TaskNotCancellable",
    "TaskNotFound",
    "TaskStatus",
    "TaskStore",
    "TaskStoreUnavailable",
    "assert_transition",
    "can_transition",
    "download_progress",
    "eta_remaining",
    "fit_load_speed",
    "new_task_id",
    "synthetic_progress",
]
