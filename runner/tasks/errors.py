"""Why a load task could not be found, moved or stored.

Exception tree::

    QuorumError (faults)
    └── TaskError                   500  task_error (base)
        ├── TaskNotFound            404  task_not_found: no such task id (or it expired)
        ├── IllegalTaskTransition   500  internal: a move the state machine forbids
        │   └── TaskNotCancellable  409  task_not_cancellable: the task already finished
        └── TaskStoreUnavailable    503  task_store_unavailable: Redis did not answer

`TaskNotCancellable` is the one forbidden move a client can cause (DELETE of a finished
task), so it answers 409; every `IllegalTaskTransition` is a bug in the caller and stays
a 500 whose message is logged, never shown. Redis exceptions become `TaskStoreUnavailable` in
exactly one place, `runner/tasks/redis_store.py::_translated`.
"""

from __future__ import annotations

from faults import QuorumError

TaskError = QuorumError.row("TaskError", "task_error", 500)
TaskNotFound = TaskError.row(
    "TaskNotFound", "task_not_found", 404, "No load task {taskId!r}", extra=("taskId",)
)
IllegalTaskTransition = TaskError.row(
    "IllegalTaskTransition",
    "illegal_task_transition",
    None,
    "Load task {taskId!r} cannot go from {current!r} to {target!r}",
)
TaskNotCancellable = IllegalTaskTransition.row(
    "TaskNotCancellable",
    "task_not_cancellable",
    409,
    "Load task {taskId!r} is already {status}; there is nothing to cancel",
    extra=("taskId", "status"),
)
TaskStoreUnavailable = TaskError.row(
    "TaskStoreUnavailable",
    "task_store_unavailable",
    503,
    "Load task store unreachable ({detail}); retry shortly",
    retry_after=True,
    defaults={"retry_after": 1},
)
