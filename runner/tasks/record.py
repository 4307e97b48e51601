"""One asynchronous model load, as a frozen record; every change returns a new record.

The record is what `GET /v1/models/load/{taskId}` reads, from whichever replica the
client reaches, so it holds everything the answer needs and nothing process-local.
Transitions go through `runner.tasks.state.assert_transition`; time is always passed
in (`now`, epoch seconds, the same clock on every replica as far as NTP allows).

Python fields are snake_case; `to_json` writes the seed's camelCase names::

    task_id -> taskId   model_id -> modelId   gpu_memory_used_mb -> gpuMemoryUsedMB
    load_time_ms -> loadTimeMs   (status, progress, eta, error keep their names)
"""

from __future__ import annotations

import math
import secrets
from dataclasses import asdict, dataclass, replace
from typing import Any

from runner.tasks.errors import IllegalTaskTransition
from runner.tasks.eta import eta_remaining, synthetic_progress
from runner.tasks.state import TaskStatus, assert_transition

TASK_ID_PREFIX = "load-"
RECORD_VERSION = 1


def new_task_id() -> str:
    """`load-` + 32 hex digits from `secrets`: unguessable, so a task id is no handle to
    someone else's load, and never sequential across replicas."""
    return TASK_ID_PREFIX + secrets.token_hex(16)


@dataclass(frozen=True, slots=True)
class LoadTask:
    """A load task. Build one with `LoadTask.new`; move it with the transition methods."""

    task_id: str
    model_id: str
    runner_id: str
    """The replica that owns (runs) the load; `mark_interrupted` at its restart fails it."""
    status: TaskStatus
    progress: float
    """0..1, never moving backwards while the task is active; 1.0 once completed."""
    eta: float | None
    """Seconds until done as last estimated; None when unknown or finished without success."""
    created_at: float
    updated_at: float
    phase_started_at: float
    """When the task entered its current status (the loader's `elapsed` for the ETA)."""
    error: str | None = None
    gpu_memory_used_mb: int | None = None
    load_time_ms: int | None = None
    # The request's load parameters, as accepted (the seed's body, minus the token).
    quantization: str | None = None
    max_context_length: int | None = None
    gpu_memory_budget_mb: int | None = None
    evict_model: str | None = None

    def __post_init__(self) -> None:
        if not self.task_id.startswith(TASK_ID_PREFIX):
            raise ValueError(f"task id must start with {TASK_ID_PREFIX!r}: {self.task_id!r}")
        if not self.model_id:
            raise ValueError("model_id must not be empty")
        if not (math.isfinite(self.progress) and 0.0 <= self.progress <= 1.0):
            raise ValueError(f"progress must lie in 0..1, not {self.progress!r}")
        _check_eta(self.eta)

    # -- construction -------------------------------------------------------------------

    @classmethod
    def new(
        cls,
        model_id: str,
        runner_id: str,
        *,
        now: float,
        eta: float | None = None,
        quantization: str | None = None,
        max_context_length: int | None = None,
        gpu_memory_budget_mb: int | None = None,
        evict_model: str | None = None,
        task_id: str | None = None,
    ) -> LoadTask:
        """A `queued` task with a fresh unguessable id (`task_id` only for tests)."""
        return cls(
            task_id=task_id if task_id is not None else new_task_id(),
            model_id=model_id,
            runner_id=runner_id,
            status=TaskStatus.QUEUED,
            progress=0.0,
            eta=eta,
            created_at=now,
            updated_at=now,
            phase_started_at=now,
            quantization=quantization,
            max_context_length=max_context_length,
            gpu_memory_budget_mb=gpu_memory_budget_mb,
            evict_model=evict_model,
        )

    # -- transitions (each returns a new record) ----------------------------------------

    def start_download(self, *, eta: float | None, now: float) -> LoadTask:
        """`queued -> downloading`: the weights are not on disk and are being fetched."""
        return self._move(TaskStatus.DOWNLOADING, now, eta=eta)

    def start_loading(self, *, eta: float | None, now: float) -> LoadTask:
        """`queued | downloading -> loading`: the engine is starting with the weights."""
        return self._move(TaskStatus.LOADING, now, eta=eta)

    def progress_to(self, progress: float, *, eta: float | None, now: float) -> LoadTask:
        """The same status with new progress and ETA.

        1. A finished task takes no progress -> `IllegalTaskTransition`.
        2. `progress` must be a finite number; it is clamped to 0..1.
        3. Progress never goes backwards: the larger of the old and new value is kept,
           so a polling client sees a monotone bar even across phases or late reports.
        """
        if self.status.terminal:  # 1
            raise IllegalTaskTransition(
                taskId=self.task_id, current=self.status.value, target=self.status.value
            )
        if not math.isfinite(progress):  # 2
            raise ValueError(f"progress must be finite, not {progress!r}")
        clamped = min(max(progress, 0.0), 1.0)
        _check_eta(eta)
        return replace(self, progress=max(self.progress, clamped), eta=eta, updated_at=now)  # 3

    def complete(self, gpu_mb: int, load_ms: int, *, now: float) -> LoadTask:
        """`loading -> completed` with the measured footprint and load duration."""
        if gpu_mb < 0 or load_ms < 0:
            raise ValueError(f"gpu_mb and load_ms must be >= 0, not {gpu_mb}, {load_ms}")
        moved = self._move(TaskStatus.COMPLETED, now, eta=0)
        return replace(moved, progress=1.0, gpu_memory_used_mb=gpu_mb, load_time_ms=load_ms)

    def fail(self, reason: str, *, now: float) -> LoadTask:
        """Any active status -> `failed`, with the reason the client reads in `error`."""
        return replace(self._move(TaskStatus.FAILED, now, eta=None), error=reason)

    def cancel(self, *, now: float, reason: str = "cancelled") -> LoadTask:
        """Any active status -> `cancelled`; a finished task raises `TaskNotCancellable` (409)."""
        return replace(self._move(TaskStatus.CANCELLED, now, eta=None), error=reason)

    def _move(self, target: TaskStatus, now: float, *, eta: float | None) -> LoadTask:
        assert_transition(self.task_id, self.status, target)
        _check_eta(eta)
        return replace(self, status=target, eta=eta, updated_at=now, phase_started_at=now)

    # -- reading ------------------------------------------------------------------------

    def elapsed(self, now: float) -> float:
        """Seconds spent in the current status (never negative, even if clocks disagree)."""
        return max(0.0, now - self.phase_started_at)

    def as_of(self, now: float) -> LoadTask:
        """The task as a client sees it at `now`.

        While the engine starts, nothing is written: the record holds when loading began
        (`phase_started_at`), the progress reached before (the download's share) and the
        predicted load time (`eta`), and progress and eta advance with the time since
        (`synthetic_progress`, `eta_remaining`). Any other status reads as stored.
        """
        if self.status is not TaskStatus.LOADING or self.eta is None:
            return self
        elapsed = max(0.0, now - self.phase_started_at)
        share = synthetic_progress(elapsed, self.eta)
        progress = self.progress + (1.0 - self.progress) * share
        return replace(self, progress=progress, eta=eta_remaining(self.eta, elapsed, share))

    def to_json(self) -> dict[str, object]:
        """The body of `GET /v1/models/load/{taskId}` in the seed's shape.

        Always `taskId`, `status`, `progress`, `eta`, `modelId`; once completed also
        `gpuMemoryUsedMB` and `loadTimeMs`; when failed (or cancelled with a reason)
        `error`, which the seed's `pollModelLoadTask` puts in its exception.
        """
        body: dict[str, object] = {
            "taskId": self.task_id,
            "status": self.status.value,
            "progress": round(self.progress, 4),
            "eta": self.eta,
            "modelId": self.model_id,
        }
        if self.status is TaskStatus.COMPLETED:
            body["gpuMemoryUsedMB"] = self.gpu_memory_used_mb
            body["loadTimeMs"] = self.load_time_ms
        if self.error is not None and self.status in (TaskStatus.FAILED, TaskStatus.CANCELLED):
            body["error"] = self.error
        return body

    def accepted_json(self) -> dict[str, object]:
        """The body of the `202 Accepted` that `POST /v1/models/load` answers.

        The seed's 202 is exactly `{taskId, status: "loading", progress: 0.0, eta}`, and
        clients written from it may test `status == "loading"`. At that moment the load is
        under way in the seed's sense even when this runner still has it `queued` or
        `downloading`, so every active status reads `"loading"` here; the exact phase is
        on `GET /v1/models/load/{taskId}`. A joined task's progress may already be above
        0.0, and is reported as is. Should the record be terminal (it should not be: only
        active tasks are joined), its real status is reported rather than a false one.
        """
        status = "loading" if self.status.active else self.status.value
        return {
            "taskId": self.task_id,
            "status": status,
            "progress": round(self.progress, 4),
            "eta": self.eta,
        }

    # -- storage ------------------------------------------------------------------------

    def to_record(self) -> dict[str, Any]:
        """Every field, snake_case, plus `v`: what the stores persist (JSON-safe)."""
        data = asdict(self)
        data["status"] = self.status.value
        data["v"] = RECORD_VERSION
        return data

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> LoadTask:
        """Inverse of `to_record`; an unknown version or a bad field raises ValueError."""
        if data.get("v") != RECORD_VERSION:
            raise ValueError(f"unknown load task record version {data.get('v')!r}")
        fields = {k: v for k, v in data.items() if k != "v"}
        try:
            fields["status"] = TaskStatus(fields["status"])
            return cls(**fields)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed load task record: {exc}") from exc


def _check_eta(eta: float | None) -> None:
    if eta is not None and (
        isinstance(eta, bool) or not isinstance(eta, int | float) or not 0 <= eta < math.inf
    ):
        raise ValueError(f"eta must be a non-negative number of seconds or None, not {eta!r}")
