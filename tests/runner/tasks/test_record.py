"""LoadTask: transitions return new records, and the JSON is the seed's shape."""

from __future__ import annotations

import math
import re
from dataclasses import FrozenInstanceError

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from runner.tasks.errors import IllegalTaskTransition, TaskNotCancellable
from runner.tasks.record import LoadTask, new_task_id
from runner.tasks.state import TaskStatus

NOW = 1_767_225_600.0
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def fresh(**kw: object) -> LoadTask:
    return LoadTask.new(MODEL, "runner-a", now=NOW, eta=300, **kw)  # type: ignore[arg-type]


def seed_poll_once(body: dict[str, object]) -> dict[str, object] | None:
    """One iteration of the seed's `pollModelLoadTask` loop, ported line for line from its JS."""
    if body["status"] == "completed":
        return {
            "modelId": body["modelId"],
            "verified": True,
            "gpuMemoryUsedMB": body["gpuMemoryUsedMB"],
        }
    if body["status"] == "failed":
        raise RuntimeError(f"Model load failed: {body['error']}")
    return None


def test_record_new_is_queued_with_unguessable_id() -> None:
    """A new task is queued at progress 0 with `load-` + 32 hex digits, different each time."""
    a, b = fresh(), fresh()
    assert re.fullmatch(r"load-[0-9a-f]{32}", a.task_id)
    assert a.task_id != b.task_id
    assert (a.status, a.progress, a.eta) == (TaskStatus.QUEUED, 0.0, 300)
    assert a.created_at == a.updated_at == a.phase_started_at == NOW
    assert re.fullmatch(r"load-[0-9a-f]{32}", new_task_id())


def test_record_is_frozen() -> None:
    """A record cannot be changed in place; transitions return new records."""
    task = fresh()
    with pytest.raises(FrozenInstanceError):
        task.progress = 0.5  # type: ignore[misc]
    moved = task.start_loading(eta=200, now=NOW + 1)
    assert task.status is TaskStatus.QUEUED
    assert moved.status is TaskStatus.LOADING


def test_record_keeps_the_load_parameters() -> None:
    """The seed's body parameters ride along on the record through every transition."""
    task = fresh(
        quantization="awq-4bit",
        max_context_length=32768,
        gpu_memory_budget_mb=40000,
        evict_model="other/model",
    )
    done = task.start_loading(eta=1, now=NOW + 1).complete(38500, 287000, now=NOW + 2)
    assert (done.quantization, done.max_context_length) == ("awq-4bit", 32768)
    assert (done.gpu_memory_budget_mb, done.evict_model) == (40000, "other/model")


def test_record_completed_json_is_the_seeds_shape() -> None:
    """On completion the body carries taskId, status, modelId, gpuMemoryUsedMB, loadTimeMs."""
    task = fresh(task_id="load-abc123")
    done = (
        task.start_download(eta=400, now=NOW + 1)
        .progress_to(0.5, eta=200, now=NOW + 100)
        .start_loading(eta=60, now=NOW + 200)
        .complete(38500, 287000, now=NOW + 287)
    )
    assert done.to_json() == {
        "taskId": "load-abc123",
        "status": "completed",
        "progress": 1.0,
        "eta": 0,
        "modelId": MODEL,
        "gpuMemoryUsedMB": 38500,
        "loadTimeMs": 287000,
    }
    assert seed_poll_once(done.to_json()) == {
        "modelId": MODEL,
        "verified": True,
        "gpuMemoryUsedMB": 38500,
    }


def test_record_failed_json_carries_error() -> None:
    """A failed task reads `failed` with `error`, which the seed's client raises with."""
    failed = fresh().start_download(eta=10, now=NOW + 1).fail("repo not found", now=NOW + 2)
    body = failed.to_json()
    assert body["status"] == "failed"
    assert body["error"] == "repo not found"
    assert body["eta"] is None
    assert "gpuMemoryUsedMB" not in body
    with pytest.raises(RuntimeError, match="Model load failed: repo not found"):
        seed_poll_once(body)


def test_record_active_json_has_no_completion_fields() -> None:
    """A running task shows taskId, status, progress, eta, modelId and nothing else."""
    body = fresh().start_loading(eta=120, now=NOW + 1).progress_to(0.25, eta=90, now=NOW + 30)
    assert body.to_json() == {
        "taskId": body.task_id,
        "status": "loading",
        "progress": 0.25,
        "eta": 90,
        "modelId": MODEL,
    }
    assert seed_poll_once(body.to_json()) is None


def test_record_cancelled_json_has_reason() -> None:
    """A cancelled task reads `cancelled` with the cancel reason in `error`."""
    body = fresh().cancel(now=NOW + 1, reason="cancelled by operator").to_json()
    assert (body["status"], body["error"]) == ("cancelled", "cancelled by operator")


@pytest.mark.parametrize("phase", ["queued", "downloading", "loading"])
def test_record_accepted_json_reads_loading_for_every_active_phase(phase: str) -> None:
    """The 202 body is the seed's {taskId, status: "loading", progress, eta} in any active phase."""
    task = fresh(task_id="load-abc123")
    if phase == "downloading":
        task = task.start_download(eta=300, now=NOW)
    elif phase == "loading":
        task = task.start_loading(eta=300, now=NOW)
    assert task.accepted_json() == {
        "taskId": "load-abc123",
        "status": "loading",
        "progress": 0.0,
        "eta": 300,
    }


def test_record_accepted_json_never_hides_a_finished_status() -> None:
    """accepted_json of a terminal record reports its real status, not `loading`."""
    failed = fresh().fail("no room", now=NOW)
    assert failed.accepted_json()["status"] == "failed"


def test_record_progress_is_monotone_and_clamped() -> None:
    """Progress never goes back, is clamped to 0..1, and refuses NaN."""
    task = fresh().start_download(eta=10, now=NOW)
    task = task.progress_to(0.6, eta=4, now=NOW + 6)
    assert task.progress_to(0.4, eta=4, now=NOW + 7).progress == 0.6
    assert task.start_loading(eta=3, now=NOW + 8).progress == 0.6
    assert task.progress_to(7.0, eta=0, now=NOW + 9).progress == 1.0
    assert task.progress_to(-1.0, eta=4, now=NOW + 9).progress == 0.6
    with pytest.raises(ValueError):
        task.progress_to(math.nan, eta=4, now=NOW + 9)


def test_record_progress_updates_timestamps_not_phase() -> None:
    """progress_to moves updated_at but keeps phase_started_at (elapsed counts the phase)."""
    task = fresh().start_loading(eta=10, now=NOW + 5)
    moved = task.progress_to(0.5, eta=5, now=NOW + 10)
    assert (moved.updated_at, moved.phase_started_at) == (NOW + 10, NOW + 5)
    assert moved.elapsed(NOW + 12) == 7.0
    assert moved.elapsed(NOW) == 0.0


def test_record_rejects_bad_eta() -> None:
    """eta is a non-negative number of seconds or None; anything else is a ValueError."""
    task = fresh()
    assert task.start_loading(eta=1.5, now=NOW).eta == 1.5
    for bad in (-1, -0.5, float("nan"), float("inf"), True, "3"):
        with pytest.raises(ValueError):
            task.start_loading(eta=bad, now=NOW)  # type: ignore[arg-type]


def test_record_complete_from_queued_is_illegal() -> None:
    """A task cannot complete without loading first: IllegalTaskTransition."""
    with pytest.raises(IllegalTaskTransition):
        fresh().complete(100, 100, now=NOW)


def test_record_cancel_finished_is_not_cancellable() -> None:
    """Cancelling a completed task raises TaskNotCancellable (409)."""
    done = fresh().start_loading(eta=1, now=NOW).complete(1, 1, now=NOW)
    with pytest.raises(TaskNotCancellable):
        done.cancel(now=NOW + 1)


def test_record_progress_on_finished_is_illegal() -> None:
    """A finished task takes no progress update."""
    failed = fresh().fail("x", now=NOW)
    with pytest.raises(IllegalTaskTransition):
        failed.progress_to(0.5, eta=1, now=NOW)


def test_record_storage_roundtrip() -> None:
    """to_record/from_record keep every field, and an unknown version is refused."""
    task = fresh(quantization="fp16").start_loading(eta=5, now=NOW + 1).fail("boom", now=NOW + 2)
    assert LoadTask.from_record(task.to_record()) == task
    with pytest.raises(ValueError, match="version"):
        LoadTask.from_record({**task.to_record(), "v": 99})
    with pytest.raises(ValueError, match="malformed"):
        LoadTask.from_record({"v": 1, "status": "queued"})


def test_record_rejects_bad_fields() -> None:
    """A record with a foreign id, no model or progress outside 0..1 cannot exist."""
    task = fresh()
    with pytest.raises(ValueError):
        LoadTask.from_record({**task.to_record(), "task_id": "abc"})
    with pytest.raises(ValueError):
        LoadTask.from_record({**task.to_record(), "model_id": ""})
    with pytest.raises(ValueError):
        LoadTask.from_record({**task.to_record(), "progress": 1.5})


class LoadTaskMachine(RuleBasedStateMachine):
    """Every call either raises the documented error or does what was asked."""

    def __init__(self) -> None:
        super().__init__()
        self.task = fresh()
        self.now = NOW
        self.last_progress = 0.0

    def _tick(self) -> float:
        self.now += 1
        return self.now

    def _try(self, target: TaskStatus, call: object) -> None:
        before = self.task
        try:
            self.task = call()  # type: ignore[operator]
        except IllegalTaskTransition:
            assert target not in _NEXT[before.status]
            assert self.task is before
            return
        assert self.task.status is target
        assert target in _NEXT[before.status]

    @rule()
    def start_download(self) -> None:
        self._try(TaskStatus.DOWNLOADING, lambda: self.task.start_download(eta=9, now=self._tick()))

    @rule()
    def start_loading(self) -> None:
        self._try(TaskStatus.LOADING, lambda: self.task.start_loading(eta=9, now=self._tick()))

    @rule(gpu=st.integers(0, 100_000), ms=st.integers(0, 10**7))
    def complete(self, gpu: int, ms: int) -> None:
        self._try(TaskStatus.COMPLETED, lambda: self.task.complete(gpu, ms, now=self._tick()))

    @rule()
    def fail(self) -> None:
        self._try(TaskStatus.FAILED, lambda: self.task.fail("boom", now=self._tick()))

    @rule()
    def cancel(self) -> None:
        was_terminal = self.task.status.terminal
        try:
            self.task = self.task.cancel(now=self._tick())
        except TaskNotCancellable:
            assert was_terminal
            return
        assert not was_terminal
        assert self.task.status is TaskStatus.CANCELLED

    @rule(p=st.floats(-1, 2, allow_nan=False))
    def progress(self, p: float) -> None:
        status = self.task.status
        try:
            self.task = self.task.progress_to(p, eta=3, now=self._tick())
        except IllegalTaskTransition:
            assert status.terminal
            return
        assert self.task.status is status

    @invariant()
    def progress_never_goes_back(self) -> None:
        assert 0.0 <= self.task.progress <= 1.0
        assert self.task.progress >= self.last_progress
        self.last_progress = self.task.progress
        if self.task.status is TaskStatus.COMPLETED:
            assert self.task.progress == 1.0 and self.task.gpu_memory_used_mb is not None


_NEXT = {
    TaskStatus.QUEUED: {
        TaskStatus.DOWNLOADING,
        TaskStatus.LOADING,
        TaskStatus.FAILED,
        TaskStatus.CANCELLED,
    },
    TaskStatus.DOWNLOADING: {TaskStatus.LOADING, TaskStatus.FAILED, TaskStatus.CANCELLED},
    TaskStatus.LOADING: {TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED},
    TaskStatus.COMPLETED: set(),
    TaskStatus.FAILED: set(),
    TaskStatus.CANCELLED: set(),
}

LoadTaskMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=20, deadline=None
)
test_record_machine_every_call_raises_documented_error_or_moves = LoadTaskMachine.TestCase
