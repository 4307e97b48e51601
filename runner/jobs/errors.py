"""Every error the jobs package raises, and the one place Redis errors are translated.

Exception tree::

    QuorumError (faults)                    status, code, type, extra, headers
    └── JobError                     500    job_error (base; never raised directly)
        ├── JobNotFound              404    job_not_found: unknown id, expired, or another
        │                                   tenant's job (404, not 403: existence is not told)
        ├── InvalidWebhook           400    invalid_webhook: not http(s), no host, too long,
        │                                   credentials in it, pointing inside the runner's
        │                                   network or at its engines (runner/jobs/outbound.py),
        │                                   or no secret to sign it with
        ├── TooManyJobs              429    too_many_jobs: the tenant's unfinished jobs on this
        │                                   replica reached JOBS_MAX_PER_TENANT (Retry-After)
        ├── JobStoreUnavailable      503    job_store_unavailable: Redis refused or timed out
        │                                   (Retry-After: 1)
        ├── JobsStopped              503    shutting_down: the runner takes no new jobs
        └── IllegalJobTransition        500    illegal_job_transition: a bug, a transition the
                                            state machine forbids (record.py)

`redis_errors()` is the only place where redis-py's exceptions (and the socket
errors under them) become `JobStoreUnavailable`; the stores wrap every Redis call in it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from redis.exceptions import RedisError

from faults import QuorumError

JobError = QuorumError.row("JobError", "job_error", 500)
JobNotFound = JobError.row(
    "JobNotFound", "job_not_found", 404, "No job found with id {job_id!r:.80}"
)
InvalidWebhook = JobError.row("InvalidWebhook", "invalid_webhook", 400)
TooManyJobs = JobError.row(
    "TooManyJobs",
    "too_many_jobs",
    429,
    "Tenant {tenant} has {limit} unfinished jobs here; retry when one has ended",
    error_type="rate_limit_error",
    retry_after=True,
)
JobStoreUnavailable = JobError.row(
    "JobStoreUnavailable", "job_store_unavailable", 503, headers={"Retry-After": "1"}
)
JobsStopped = JobError.row(
    "JobsStopped",
    "shutting_down",
    503,
    "The runner is shutting down; submit the job to another replica",
    headers={"Retry-After": "1"},
)
IllegalJobTransition = JobError.row("IllegalJobTransition", "illegal_job_transition")


@contextmanager
def redis_errors(action: str) -> Iterator[None]:
    """Translate Redis and socket errors raised inside the block into JobStoreUnavailable."""
    try:
        yield
    except (RedisError, OSError) as exc:
        raise JobStoreUnavailable(
            f"job store unreachable while {action} ({type(exc).__name__}); retry shortly"
        ) from exc
