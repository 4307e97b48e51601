"""A job's record and the pure transitions between its states.

State machine (`ALLOWED` below is the same table)::

    QUEUED ──start──▶ RUNNING ──succeed──▶ SUCCEEDED
      │                 ├──────fail─────▶ FAILED
      │                 └─────cancel────▶ CANCELLED
      ├───────fail──────────────────────▶ FAILED      (e.g. interrupted before it ran)
      └───────cancel────────────────────▶ CANCELLED

SUCCEEDED, FAILED and CANCELLED are terminal: after them only webhook
deliveries are appended (`add_delivery`). Every transition is a pure function
`(job, ..., now) -> job`; a forbidden one raises `IllegalJobTransition`. Nothing
here reads a clock or does I/O; the manager passes `now`.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import orjson

from runner.jobs.errors import IllegalJobTransition

JOB_ID_RE = re.compile(r"job_[A-Za-z0-9_-]{1,64}")


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})

ALLOWED: Mapping[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset({JobStatus.RUNNING, JobStatus.FAILED, JobStatus.CANCELLED}),
    JobStatus.RUNNING: frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED}),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}


def new_job_id() -> str:
    """`job_` and 128 random bits in hex: unguessable, safe in a URL and a Redis key."""
    return "job_" + secrets.token_hex(16)


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a job is: `done` of `total` units (audio seconds for speech, steps for images)."""

    done: float
    total: float | None = None

    @property
    def fraction(self) -> float | None:
        if self.total is None or self.total <= 0:
            return None
        return min(1.0, max(0.0, self.done / self.total))

    def to_json(self) -> dict[str, object]:
        fraction = self.fraction
        return {
            "done": round(self.done, 3),
            "total": None if self.total is None else round(self.total, 3),
            "fraction": None if fraction is None else round(fraction, 4),
        }


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a job failed or was cancelled, as a client reads it (never a traceback)."""

    code: str
    message: str

    def to_json(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message}


@dataclass(frozen=True, slots=True)
class Delivery:
    """One webhook delivery attempt: when, and the receiver's status code or the error."""

    attempt: int
    at: float
    status_code: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300

    def to_json(self) -> dict[str, object]:
        return {
            "attempt": self.attempt,
            "at": round(self.at, 3),
            "status_code": self.status_code,
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class Job:
    """Everything known about one job; `result` is JSON (normalised by `succeed`)."""

    id: str
    kind: str
    tenant: str
    model: str
    runner_id: str
    status: JobStatus
    created_at: float
    updated_at: float
    started_at: float | None = None
    finished_at: float | None = None
    progress: Progress | None = None
    result: object = None
    error: Failure | None = None
    webhook: str | None = None
    deliveries: tuple[Delivery, ...] = ()

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def to_json(self, *, deliveries: bool = True) -> dict[str, object]:
        """The body of `GET /v1/jobs/{id}` (and a webhook's `data`): never the tenant."""
        body: dict[str, object] = {
            "object": "job",
            "id": self.id,
            "kind": self.kind,
            "model": self.model,
            "status": self.status.value,
            "progress": None if self.progress is None else self.progress.to_json(),
            "created_at": int(self.created_at),
            "started_at": _int_or_none(self.started_at),
            "finished_at": _int_or_none(self.finished_at),
        }
        if self.status is JobStatus.SUCCEEDED:
            body["result"] = self.result
        if self.error is not None:
            body["error"] = self.error.to_json()
        if deliveries and self.webhook is not None:
            body["webhook"] = {
                "url": self.webhook,
                "deliveries": [d.to_json() for d in self.deliveries],
            }
        return body

    def to_record(self) -> dict[str, object]:
        """Everything, for the store (tenant and runner included)."""
        return {
            "id": self.id,
            "kind": self.kind,
            "tenant": self.tenant,
            "model": self.model,
            "runner_id": self.runner_id,
            "status": self.status.value,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "progress": None
            if self.progress is None
            else {"done": self.progress.done, "total": self.progress.total},
            "result": self.result,
            "error": None if self.error is None else self.error.to_json(),
            "webhook": self.webhook,
            "deliveries": [
                {"attempt": d.attempt, "at": d.at, "status_code": d.status_code, "error": d.error}
                for d in self.deliveries
            ],
        }

    @classmethod
    def from_record(cls, data: Mapping[str, Any]) -> Job:
        progress, error = data["progress"], data["error"]
        return cls(
            id=data["id"],
            kind=data["kind"],
            tenant=data["tenant"],
            model=data["model"],
            runner_id=data["runner_id"],
            status=JobStatus(data["status"]),
            created_at=data["created_at"],
            updated_at=data["updated_at"],
            started_at=data["started_at"],
            finished_at=data["finished_at"],
            progress=None if progress is None else Progress(progress["done"], progress["total"]),
            result=data["result"],
            error=None if error is None else Failure(error["code"], error["message"]),
            webhook=data["webhook"],
            deliveries=tuple(Delivery(**d) for d in data["deliveries"]),
        )


def encode(job: Job) -> bytes:
    return orjson.dumps(job.to_record())


def decode(raw: bytes | str) -> Job:
    return Job.from_record(orjson.loads(raw))


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else int(value)


def _move(job: Job, to: JobStatus) -> None:
    if to not in ALLOWED[job.status]:
        raise IllegalJobTransition(f"job {job.id}: {job.status.value} -> {to.value} is not allowed")


# Transitions: each returns a new Job; the argument is never changed.


def new_job(
    job_id: str,
    kind: str,
    tenant: str,
    model: str,
    runner_id: str,
    now: float,
    webhook: str | None = None,
) -> Job:
    """A job just accepted: QUEUED, owned by `runner_id`, readable by `tenant` only."""
    return Job(
        id=job_id,
        kind=kind,
        tenant=tenant,
        model=model,
        runner_id=runner_id,
        status=JobStatus.QUEUED,
        created_at=now,
        updated_at=now,
        webhook=webhook,
    )


def start(job: Job, now: float) -> Job:
    """QUEUED -> RUNNING: the work has its slot."""
    _move(job, JobStatus.RUNNING)
    return replace(job, status=JobStatus.RUNNING, started_at=now, updated_at=now)


def report(job: Job, progress: Progress, now: float) -> Job:
    """RUNNING -> RUNNING with new progress (a QUEUED job must `start` first)."""
    if job.status is not JobStatus.RUNNING:
        raise IllegalJobTransition(f"job {job.id}: progress while {job.status.value}")
    return replace(job, progress=progress, updated_at=now)


def succeed(job: Job, result: object, now: float) -> Job:
    """RUNNING -> SUCCEEDED with `result`.

    1. The result is normalised through JSON (tuples become lists, ...) so every store
       returns the same value; a result that is not JSON raises TypeError, unchanged job.
    2. Progress with a known total reads complete.
    """
    _move(job, JobStatus.SUCCEEDED)
    normal = orjson.loads(orjson.dumps(result))  # 1.
    progress = job.progress
    if progress is not None and progress.total is not None:  # 2.
        progress = Progress(progress.total, progress.total)
    return replace(
        job,
        status=JobStatus.SUCCEEDED,
        result=normal,
        progress=progress,
        updated_at=now,
        finished_at=now,
    )


def fail(job: Job, failure: Failure, now: float) -> Job:
    """QUEUED or RUNNING -> FAILED with the reason the client will read."""
    _move(job, JobStatus.FAILED)
    return replace(job, status=JobStatus.FAILED, error=failure, updated_at=now, finished_at=now)


def cancel(job: Job, now: float, reason: str = "cancelled at the client's request") -> Job:
    """QUEUED or RUNNING -> CANCELLED."""
    _move(job, JobStatus.CANCELLED)
    return replace(
        job,
        status=JobStatus.CANCELLED,
        error=Failure("job_cancelled", reason),
        updated_at=now,
        finished_at=now,
    )


def add_delivery(job: Job, delivery: Delivery, now: float) -> Job:
    """A terminal job records one more webhook attempt; the status does not change."""
    if not job.terminal:
        raise IllegalJobTransition(f"job {job.id}: webhook delivery while {job.status.value}")
    return replace(job, deliveries=(*job.deliveries, delivery), updated_at=now)
