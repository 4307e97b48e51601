"""The load task's lifecycle: an enum and the one table of moves it may make.

::

    queued ──► downloading ──► loading ──► completed
      │  └───────────────────────►│
      │            │              │
      └────────────┴──────────────┴──► failed | cancelled

`completed`, `failed` and `cancelled` are terminal: nothing moves a task out of them.
Every status change goes through `assert_transition` (cog's `_assert_state`), so a
forbidden move raises instead of corrupting what a polling client reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from runner.tasks.errors import IllegalTaskTransition, TaskNotCancellable


class TaskStatus(StrEnum):
    """What `GET /v1/models/load/{taskId}` reports in `status` (the values are the wire's)."""

    QUEUED = "queued"
    DOWNLOADING = "downloading"
    LOADING = "loading"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """True for `completed`, `failed`, `cancelled`: the task will never change again."""
        return self in TERMINAL

    @property
    def active(self) -> bool:
        """True while the load is under way (`queued`, `downloading`, `loading`)."""
        return self not in TERMINAL


TERMINAL: frozenset[TaskStatus] = frozenset(
    {TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED}
)
ACTIVE: frozenset[TaskStatus] = frozenset(set(TaskStatus) - TERMINAL)

TRANSITIONS: Mapping[TaskStatus, frozenset[TaskStatus]] = {
    TaskStatus.QUEUED: frozenset(
        {TaskStatus.DOWNLOADING, TaskStatus.LOADING, TaskStatus.FAILED, TaskStatus.CANCELLED}
    ),
    TaskStatus.DOWNLOADING: frozenset(
        {TaskStatus.LOADING, TaskStatus.FAILED, TaskStatus.CANCELLED}
    ),
    TaskStatus.LOADING: frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED}),
    TaskStatus.COMPLETED: frozenset(),
    TaskStatus.FAILED: frozenset(),
    TaskStatus.CANCELLED: frozenset(),
}
"""Status -> the statuses it may move to. The only source of truth; stores derive from it."""


def can_transition(current: TaskStatus, target: TaskStatus) -> bool:
    """True when `current -> target` is in `TRANSITIONS` (staying put is not a transition)."""
    return target in TRANSITIONS[current]


def assert_transition(task_id: str, current: TaskStatus, target: TaskStatus) -> None:
    """Raise unless `current -> target` is allowed.

    1. Allowed by `TRANSITIONS` -> return.
    2. A cancel of a task that already finished -> `TaskNotCancellable` (409, the
       client's DELETE came too late).
    3. Anything else -> `IllegalTaskTransition` (500, a bug in the caller).
    """
    if can_transition(current, target):  # 1
        return
    if target is TaskStatus.CANCELLED and current.terminal:  # 2
        raise TaskNotCancellable(taskId=task_id, status=current.value)
    raise IllegalTaskTransition(taskId=task_id, current=current.value, target=target.value)  # 3


def _reachable(start: TaskStatus) -> frozenset[TaskStatus]:
    seen: set[TaskStatus] = set()
    todo = list(TRANSITIONS[start])
    while todo:
        status = todo.pop()
        if status not in seen:
            seen.add(status)
            todo.extend(TRANSITIONS[status])
    return frozenset(seen)


REACHABLE: Mapping[TaskStatus, frozenset[TaskStatus]] = {s: _reachable(s) for s in TaskStatus}
"""Status -> every status a chain of legal moves leads to (`queued` reaches `completed`)."""


def may_overwrite(stored: TaskStatus, incoming: TaskStatus) -> bool:
    """True when a store may replace a record in `stored` status by one in `incoming`.

    The same status (a progress update) or one that legal moves lead to (a writer may
    skip storing an intermediate step: a fast load goes `queued -> loading -> completed`
    with one write). A write that would move a task backwards or out of a terminal
    status (a stale writer racing a cancel) is not.
    """
    return incoming is stored or incoming in REACHABLE[stored]


def statuses_that_may_become(incoming: TaskStatus) -> frozenset[TaskStatus]:
    """Every stored status that `may_overwrite` lets `incoming` replace (for the Redis script)."""
    return frozenset(s for s in TaskStatus if may_overwrite(s, incoming))
