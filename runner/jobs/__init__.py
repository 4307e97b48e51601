"""Async jobs: long work (transcriptions, image generations) run in the background.

`JobManager` (manager.py) is the entry point, built with its store and webhook sender
from the settings in build.py; `http.py` holds the answers the routes send; records and
their state machine are in record.py, storage in store.py (memory, Redis) and
sqlite_store.py (STATE_DB), signed webhooks in webhooks.py, where they may go in
outbound.py, errors in errors.py.
"""

from runner.jobs.errors import (
    IllegalJobTransition,
    InvalidWebhook,
    JobError,
    JobNotFound,
    JobsStopped,
    JobStoreUnavailable,
)
from runner.jobs.manager import JobManager, Work
from runner.jobs.progress import ProgressReporter, Throttle
from runner.jobs.record import Delivery, Failure, Job, JobStatus, Progress
from runner.jobs.sqlite_store import SqliteJobStore
from runner.jobs.store import JobStore, MemoryJobStore, RedisJobStore
from runner.jobs.webhooks import RetryPolicy, WebhookSender, validate_webhook_url

__all__ = [
    "Delivery",
    "Failure",
    "IllegalJobTransition",
    "InvalidWebhook",
    "Job",
    "JobError",
    "JobManager",
    "JobNotFound",
    "JobStatus",
    "JobStore",
    "JobStoreUnavailable",
    "JobsStopped",
    "MemoryJobStore",
    "Progress",
    "ProgressReporter",
    "RedisJobStore",
    "RetryPolicy",
    "SqliteJobStore",
    "Throttle",
    "WebhookSender",
    "Work",
    "validate_webhook_url",
]
