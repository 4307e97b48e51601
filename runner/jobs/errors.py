"""Every error the jobs package raises, and the one place Redis errors are translated.

Exception tree::

    RunnerError (runner/errors.py)          status, code, type, extra, headers
    └── JobError                     500    job_error (base; never raised directly)
        ├── JobNotFound              404    job_not_found: unknown id, expired, or another
        │                                   tenant's job (404, not 403: existence is not told)
        ├── InvalidWebhook           400    invalid_webhook: not http(s), no host, too long,
        │                                   credentials in it, or no WEBHOOK_SECRET configured
        ├── JobStoreUnavailable      503    job_store_unavailable: Redis refused or timed out
        │                                   (Retry-After: 1)
        ├── JobsStopped              503    shutting_down: the runner takes no new jobs
        └── IllegalTransition        500    illegal_job_transition: a bug, a transition the
                                            state machine forbids (record.py)

`redis_errors()` is the only place where redis-py's exceptions (and the socket
errors under them) become `JobStoreUnavailable`; the stores wrap every Redis call in it.
The runner's error map (`runner/errors.py`) turns all of these into
`{"error": {"code", "message", "type", **extra}}`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from redis.exceptions import RedisError

from runner.errors import RunnerError


class JobError(RunnerError):
    """Base of the jobs package's errors: a `RunnerError`, so the runner's map applies."""

    status = 500
    code = "job_error"
    type = "server_error"


class JobNotFound(JobError):
    """No job with this id that the caller may read (the same answer for both cases)."""

    status = 404
    code = "job_not_found"
    type = "invalid_request_error"

    def __init__(self, job_id: str) -> None:
        super().__init__(f"No job found with id {job_id[:80]!r}")


class InvalidWebhook(JobError):
    """The `webhook` given with a job cannot be used; the message says why."""

    status = 400
    code = "invalid_webhook"
    type = "invalid_request_error"


class JobStoreUnavailable(JobError):
    """The job store (Redis) did not answer; jobs cannot be submitted or read until it does."""

    status = 503
    code = "job_store_unavailable"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"Retry-After": "1"})


class JobsStopped(JobError):
    """The runner is shutting down and takes no new jobs."""

    status = 503
    code = "shutting_down"

    def __init__(self) -> None:
        super().__init__(
            "The runner is shutting down; submit the job to another replica",
            headers={"Retry-After": "1"},
        )


class IllegalTransition(JobError):
    """A job was asked to move between two states the state machine does not join."""

    code = "illegal_job_transition"


@contextmanager
def redis_errors(action: str) -> Iterator[None]:
    """Translate Redis and socket errors raised inside the block into JobStoreUnavailable."""
    try:
        yield
    except (RedisError, OSError) as exc:
        raise JobStoreUnavailable(
            f"job store unreachable while {action} ({type(exc).__name__}); retry shortly"
        ) from exc
