"""Where load tasks live: in this process, or in Redis where every replica reads them.

Both stores keep the same promises (one parametrized suite tests them):

- `put` never lets a stale writer undo a later state: a record replaces the stored
  one only with the same status (a progress update) or a status that legal moves lead
  to (`runner.tasks.state.may_overwrite`; `queued -> completed` in one write is fine).
  A refused write returns the stored record, so a loader whose `put` comes back
  `cancelled` learns it must stop.
- `create_or_join` is atomic per runner and model: of any number of concurrent loads of
  one model on one runner, one creates the task and the rest join it. Each replica loads
  its own models, so a load on another replica never joins this one's task (it gets a
  task of its own, and the model on that replica). An active task not written for
  `stale_after_s` (its writes failed, or its runner is stuck) is not joined: it is
  failed as interrupted and a new task takes its place. So
  the owner must `put` its task at least every `stale_after_s` (progress updates do).
- Finished tasks stay readable for `retention_s` (24 h by default), then read as absent
  (404). Active tasks never expire: `mark_interrupted` fails them at their runner's
  restart, and a new load of the same model on the same runner fails a stale one (above).

`MemoryTaskStore` is here; `RedisTaskStore` (its layout and scripts) is in
`runner/tasks/redis_store.py`. The shared helpers below (`interrupted_reason`,
`is_stale`, `stale_reason`, `fail_each`) keep the two stores' wording and rules one.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Protocol

from runner.tasks.record import LoadTask
from runner.tasks.state import may_overwrite

Clock = Callable[[], float]

DEFAULT_RETENTION_S = 24 * 3600
DEFAULT_STALE_AFTER_S = 900.0


class TaskStore(Protocol):
    async def put(self, task: LoadTask) -> LoadTask:
        """Write `task` unless the stored copy may not become it; return what is stored now."""
        ...

    async def get(self, task_id: str) -> LoadTask | None: ...

    async def create_or_join(self, task: LoadTask) -> tuple[LoadTask, bool]:
        """Store the new active `task`, or join the live active task of the same runner and
        model: (task, created)."""
        ...

    async def list_active(self) -> list[LoadTask]:
        """Every active task, oldest first."""
        ...

    async def mark_interrupted(
        self, runner_id: str, reason: str = "runner restarted", *, now: float
    ) -> int:
        """Fail every active task of `runner_id`; return how many were failed."""
        ...

    async def aclose(self) -> None: ...


def interrupted_reason(reason: str, task: LoadTask) -> str:
    """`interrupted: <reason> while the task was <status>` (what the client reads)."""
    return f"interrupted: {reason} while the task was {task.status.value}"


def is_stale(task: LoadTask, now: float, stale_after_s: float | None) -> bool:
    """True when an active task was last written more than `stale_after_s` before `now`."""
    return stale_after_s is not None and task.updated_at < now - stale_after_s


def stale_reason(task: LoadTask, now: float) -> str:
    return interrupted_reason(
        f"runner {task.runner_id!r} stopped reporting "
        f"(no update for {int(now - task.updated_at)} s)",
        task,
    )


async def fail_each(store: TaskStore, failed: Iterable[LoadTask]) -> int:
    """Put each failed record; count those the store accepted (a finished task wins)."""
    count = 0
    for task in failed:
        stored = await store.put(task)
        count += stored.status is task.status
    return count


def check_new(task: LoadTask) -> None:
    if not task.status.active:
        raise ValueError(f"create_or_join takes an active task, not a {task.status.value} one")


def _index(task: LoadTask) -> tuple[str, str]:
    """The join index's key: a task is joined only by loads on its own runner."""
    return (task.runner_id, task.model_id)


class MemoryTaskStore:
    """One process's tasks (single replica); the injected clock only ages finished tasks."""

    def __init__(
        self,
        clock: Clock,
        *,
        retention_s: float = DEFAULT_RETENTION_S,
        stale_after_s: float | None = DEFAULT_STALE_AFTER_S,
    ) -> None:
        self._clock = clock
        self._retention_s = retention_s
        self._stale_after_s = stale_after_s
        self._tasks: dict[str, LoadTask] = {}
        self._expiry: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []
        self._by_model: dict[tuple[str, str], str] = {}  # (runner, model) -> active task

    async def put(self, task: LoadTask) -> LoadTask:
        return self._put(task)

    def _put(self, task: LoadTask) -> LoadTask:
        self._purge()
        stored = self._tasks.get(task.task_id)
        if stored is not None and not may_overwrite(stored.status, task.status):
            return stored
        self._tasks[task.task_id] = task
        if task.status.terminal:
            deadline = self._clock() + self._retention_s
            self._expiry[task.task_id] = deadline
            heapq.heappush(self._heap, (deadline, task.task_id))
            if self._by_model.get(_index(task)) == task.task_id:
                del self._by_model[_index(task)]
        else:
            self._by_model.setdefault(_index(task), task.task_id)
        return task

    async def get(self, task_id: str) -> LoadTask | None:
        self._purge()
        return self._tasks.get(task_id)

    async def create_or_join(self, task: LoadTask) -> tuple[LoadTask, bool]:
        """1. The runner's active task for the model, written within `stale_after_s` -> join it.
        2. It exists but is stale -> fail it as interrupted.
        3. Store `task` as the model's active task -> created.
        """
        check_new(task)
        current = self._active(_index(task))
        if current is not None:
            if not is_stale(current, task.created_at, self._stale_after_s):  # 1
                return current, False
            now = task.created_at
            self._put(current.fail(stale_reason(current, now), now=now))  # 2
        self._by_model[_index(task)] = task.task_id  # 3
        return self._put(task), True

    def _active(self, index: tuple[str, str]) -> LoadTask | None:
        self._purge()
        task_id = self._by_model.get(index)
        task = self._tasks.get(task_id) if task_id is not None else None
        return task if task is not None and task.status.active else None

    async def list_active(self) -> list[LoadTask]:
        self._purge()
        return sorted(
            (t for t in self._tasks.values() if t.status.active), key=lambda t: t.created_at
        )

    async def mark_interrupted(
        self, runner_id: str, reason: str = "runner restarted", *, now: float
    ) -> int:
        mine = [t for t in await self.list_active() if t.runner_id == runner_id]
        return await fail_each(self, (t.fail(interrupted_reason(reason, t), now=now) for t in mine))

    def _purge(self) -> None:
        now = self._clock()
        while self._heap and self._heap[0][0] <= now:
            deadline, task_id = heapq.heappop(self._heap)
            if self._expiry.get(task_id) == deadline:
                del self._expiry[task_id]
                del self._tasks[task_id]

    def __len__(self) -> int:
        self._purge()
        return len(self._tasks)

    async def aclose(self) -> None:
        return None
