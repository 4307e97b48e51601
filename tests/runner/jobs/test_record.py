"""The job record: guarded transitions, the GET body, the stored form."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.jobs import record
from runner.jobs.errors import IllegalJobTransition
from runner.jobs.record import ALLOWED, Delivery, Failure, Job, JobStatus, Progress
from tests.runner.jobs.support import NOW, queued, running


def test_record_new_job_is_queued() -> None:
    """A new job is QUEUED, owned by its runner, with no progress, result or error."""
    job = queued()
    assert job.status is JobStatus.QUEUED
    assert (job.runner_id, job.tenant, job.created_at) == ("runner-a", "acme", NOW)
    assert job.progress is None and job.result is None and job.error is None
    assert not job.terminal


def test_record_ids_are_unique_and_well_formed() -> None:
    """Generated ids are `job_` and 32 hex digits, and never repeat."""
    ids = {record.new_job_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(record.JOB_ID_RE.fullmatch(i) and len(i) == 36 for i in ids)


def test_record_happy_path() -> None:
    """queued -> running -> progress -> succeeded, with times and a complete progress."""
    job = record.start(queued(), NOW + 1)
    job = record.report(job, Progress(3.0, 10.0), NOW + 2)
    job = record.succeed(job, {"text": "hello"}, NOW + 3)
    assert job.status is JobStatus.SUCCEEDED
    assert (job.started_at, job.updated_at, job.finished_at) == (NOW + 1, NOW + 3, NOW + 3)
    assert job.progress == Progress(10.0, 10.0)
    assert job.result == {"text": "hello"}


def test_record_result_is_normalised_through_json() -> None:
    """Tuples in a result become lists, as any store would give them back."""
    job = record.succeed(running(), {"segments": (1, 2)}, NOW)
    assert job.result == {"segments": [1, 2]}


def test_record_result_that_is_not_json_raises_type_error() -> None:
    """A result orjson cannot write raises TypeError and leaves no half-finished job."""
    job = running()
    with pytest.raises(TypeError):
        record.succeed(job, {"x": object()}, NOW)
    assert job.status is JobStatus.RUNNING


def test_record_progress_needs_running() -> None:
    """Progress on a queued job is refused: the job must start first."""
    with pytest.raises(IllegalJobTransition):
        record.report(queued(), Progress(1.0), NOW)


def test_record_terminal_states_are_final() -> None:
    """No transition leaves succeeded, failed or cancelled."""
    ends = [
        record.succeed(running(), None, NOW),
        record.fail(running(), Failure("x", "y"), NOW),
        record.cancel(running(), NOW),
    ]
    moves: list[Callable[[Job], Job]] = [
        lambda j: record.start(j, NOW),
        lambda j: record.succeed(j, None, NOW),
        lambda j: record.fail(j, Failure("x", "y"), NOW),
        lambda j: record.cancel(j, NOW),
        lambda j: record.report(j, Progress(1.0), NOW),
    ]
    for job in ends:
        for move in moves:
            with pytest.raises(IllegalJobTransition):
                move(job)


def test_record_deliveries_only_once_finished() -> None:
    """Webhook attempts are appended to finished jobs only; the status stays."""
    with pytest.raises(IllegalJobTransition):
        record.add_delivery(running(), Delivery(1, NOW, 200), NOW)
    done = record.fail(running(), Failure("engine_error", "boom"), NOW)
    done = record.add_delivery(done, Delivery(1, NOW, error="ConnectError"), NOW + 1)
    done = record.add_delivery(done, Delivery(2, NOW + 2, 204), NOW + 2)
    assert [d.ok for d in done.deliveries] == [False, True]
    assert done.status is JobStatus.FAILED


TRANSITIONS: dict[JobStatus, Callable[[Job], Job]] = {
    JobStatus.RUNNING: lambda j: record.start(j, NOW),
    JobStatus.SUCCEEDED: lambda j: record.succeed(j, {"ok": True}, NOW),
    JobStatus.FAILED: lambda j: record.fail(j, Failure("x", "y"), NOW),
    JobStatus.CANCELLED: lambda j: record.cancel(j, NOW),
}


@given(st.lists(st.sampled_from(sorted(TRANSITIONS)), max_size=8))
def test_record_every_move_follows_the_table(moves: list[JobStatus]) -> None:
    """Any sequence of moves: each one either follows ALLOWED or raises IllegalJobTransition."""
    job = queued()
    for target in moves:
        before = job
        if target in ALLOWED[job.status]:
            job = TRANSITIONS[target](job)
            assert job.status is target
        else:
            with pytest.raises(IllegalJobTransition):
                TRANSITIONS[target](job)
            assert job == before


def test_record_to_json_running() -> None:
    """The GET body: object, id, kind, model, status, progress with a fraction; no tenant."""
    job = record.report(running(), Progress(2.5, 10.0), NOW + 2)
    body = job.to_json()
    assert body == {
        "object": "job",
        "id": "job_one",
        "kind": "transcription",
        "model": "whisper-tiny.en",
        "status": "running",
        "progress": {"done": 2.5, "total": 10.0, "fraction": 0.25},
        "created_at": int(NOW),
        "started_at": int(NOW) + 1,
        "finished_at": None,
    }
    assert "acme" not in str(body) and "runner-a" not in str(body)


def test_record_to_json_result_or_error() -> None:
    """A succeeded job shows its result; a failed or cancelled one its error, never a result."""
    ok = record.succeed(running(), {"text": "hi"}, NOW).to_json()
    assert ok["result"] == {"text": "hi"} and "error" not in ok
    bad = record.fail(running(), Failure("engine_error", "worker died"), NOW).to_json()
    assert bad["error"] == {"code": "engine_error", "message": "worker died"}
    assert "result" not in bad
    gone = record.cancel(running(), NOW).to_json()
    assert gone["status"] == "cancelled" and gone["error"]["code"] == "job_cancelled"  # type: ignore[index]


def test_record_to_json_webhook_deliveries() -> None:
    """With a webhook, the body lists every attempt; `deliveries=False` leaves it out."""
    job = record.fail(
        record.start(queued(webhook="https://example.test/h"), NOW), Failure("x", "y"), NOW
    )
    job = record.add_delivery(job, Delivery(1, NOW + 0.25, 503), NOW)
    assert job.to_json()["webhook"] == {
        "url": "https://example.test/h",
        "deliveries": [{"attempt": 1, "at": NOW + 0.25, "status_code": 503, "error": None}],
    }
    assert "webhook" not in job.to_json(deliveries=False)


def test_record_progress_without_total_has_no_fraction() -> None:
    """Progress with no known total reports done only."""
    assert Progress(4.0).to_json() == {"done": 4.0, "total": None, "fraction": None}
    assert Progress(12.0, 10.0).fraction == 1.0


def test_record_encode_decode_round_trip() -> None:
    """The stored form gives back an equal Job, tenant, runner and deliveries included."""
    job = record.start(queued(webhook="http://h.test/x"), NOW + 1)
    job = record.report(job, Progress(1.5, 3.0), NOW + 2)
    job = record.succeed(job, {"text": "a", "n": [1, 2.5, None]}, NOW + 3)
    job = record.add_delivery(job, Delivery(1, NOW + 4, None, "ReadTimeout"), NOW + 4)
    back = record.decode(record.encode(job))
    assert back == job
    assert isinstance(back, Job) and back.status is JobStatus.SUCCEEDED
