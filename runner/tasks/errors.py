"""Why a load task could not be found, moved or stored.

Exception tree::

    RunnerError (runner/errors.py)        status, code, type, extra, headers
    └── TaskError                  500    base of the load-task errors
        ├── TaskNotFound           404    task_not_found: no such task id (or it expired)
        ├── IllegalTransition      500    internal: code asked for a move the state machine forbids
        │   └── TaskNotCancellable 409    task_not_cancellable: the task already finished
        └── TaskStoreUnavailable   503    task_store_unavailable: Redis did not answer

`TaskNotCancellable` is the one illegal transition a client can cause (DELETE of a
finished task), so it is an `IllegalTransition` that answers 409; every other
`IllegalTransition` is a bug in the caller and stays a 500 whose message is logged,
never shown. Redis exceptions become `TaskStoreUnavailable` in exactly one place,
`runner/tasks/redis_store.py::_translated`. The runner's error map
(`runner/errors.py`) turns all of them into `{"error": {"code", "message", "type", **extra}}`.
"""

from __future__ import annotations

from runner.errors import RunnerError


class TaskError(RunnerError):
    """Base of the load-task errors: a `RunnerError`, so the runner's map applies as is."""

    code = "task_error"


class TaskNotFound(TaskError):
    """No task with this id: never created here, or its retention ran out."""

    status = 404
    code = "task_not_found"
    type = "invalid_request_error"

    def __init__(self, task_id: str) -> None:
        super().__init__(f"No load task {task_id!r}", extra={"taskId": task_id})
        self.task_id = task_id


class IllegalTransition(TaskError):
    """A move the task state machine forbids, e.g. `completed -> loading`: a caller's bug."""

    def __init__(self, task_id: str, current: str, target: str) -> None:
        super().__init__(f"Load task {task_id!r} cannot go from {current!r} to {target!r}")
        self.task_id = task_id
        self.current = current
        self.target = target


class TaskNotCancellable(IllegalTransition):
    """Cancel of a task that already reached `completed`, `failed` or `cancelled`."""

    status = 409
    code = "task_not_cancellable"
    type = "invalid_request_error"

    def __init__(self, task_id: str, current: str) -> None:
        super().__init__(task_id, current, "cancelled")
        # Replace the internal wording with one a client can act on.
        self.args = (f"Load task {task_id!r} is already {current}; there is nothing to cancel",)
        self.extra = {"taskId": task_id, "status": current}


class TaskStoreUnavailable(TaskError):
    """The task store (Redis) did not answer; the caller retries shortly."""

    status = 503
    code = "task_store_unavailable"
    type = "server_error"

    def __init__(self, detail: str, retry_after_s: int = 1) -> None:
        super().__init__(
            f"Load task store unreachable ({detail}); retry shortly",
            headers={"Retry-After": str(retry_after_s)},
        )
