"""Why the scheduler refused or dropped a request.

Exception tree::

    RunnerError (runner/errors.py)       status, code, type, extra, headers
    └── SchedulerError
        ├── QueueFull             503    queue_full: MAX_QUEUE_DEPTH requests already wait
        ├── TenantQueueFull       503    tenant_queue_full: this tenant's queue cap is reached
        ├── QueueTimeout          503    queue_timeout: waited longer than QUEUE_TIMEOUT_MS
        ├── SchedulerStopped      503    shutting_down: the runner stopped while it waited
        ├── ModelNotLoaded        404    model_not_loaded: not resident, not loading, not autoload
        ├── ModelLoadFailed       503    model_load_failed: the load it waited for failed (reason)
        ├── ModelDoesNotFit       503    model_does_not_fit: no eviction can make room (reason)
        ├── ModelUnloading        503    model_unloading: unloaded or evicted while it waited
        └── ModelEngineCrashed    502    engine_crashed: the engine died while it waited

The queue refusals carry `Retry-After` (seconds, from the measured drain
rate) in `headers`; the model ones carry the model (and reason) in `extra`.
The runner's error map (`runner/errors.py`) turns them into
`{"error": {"code", "message", "type", **extra}}`.
"""

from __future__ import annotations

from runner.errors import RunnerError


class SchedulerError(RunnerError):
    """Base of the scheduler's refusals: a `RunnerError`, so the runner's map applies as is."""

    status = 503
    code = "scheduler_error"
    type = "server_error"


def _retry_after(seconds: int) -> dict[str, str]:
    return {"Retry-After": str(seconds)}


class QueueFull(SchedulerError):
    """The runner-wide queue holds `max_depth` waiting requests (the seed's body)."""

    code = "queue_full"

    def __init__(self, depth: int, max_depth: int, avg_wait_ms: int, retry_after_s: int) -> None:
        super().__init__(
            f"Queue depth {depth}/{max_depth}, retry in {retry_after_s} seconds",
            extra={"queueDepth": depth, "avgWaitMs": avg_wait_ms},
            headers=_retry_after(retry_after_s),
        )
        self.retry_after_s = retry_after_s


class TenantQueueFull(SchedulerError):
    """One tenant already has its maximum number of requests waiting."""

    code = "tenant_queue_full"

    def __init__(self, tenant: str, depth: int, cap: int, retry_after_s: int) -> None:
        super().__init__(
            f"Tenant {tenant!r} has {depth}/{cap} requests queued, "
            f"retry in {retry_after_s} seconds",
            extra={"tenant": tenant, "tenantQueueDepth": depth, "tenantMaxDepth": cap},
            headers=_retry_after(retry_after_s),
        )
        self.retry_after_s = retry_after_s


class QueueTimeout(SchedulerError):
    """The request waited longer than the queue timeout without getting a slot."""

    code = "queue_timeout"

    def __init__(self, waited_ms: int, timeout_ms: int, retry_after_s: int) -> None:
        super().__init__(
            f"Waited {waited_ms} ms in the queue (limit {timeout_ms} ms), "
            f"retry in {retry_after_s} seconds",
            extra={"queueWaitMs": waited_ms, "queueTimeoutMs": timeout_ms},
            headers=_retry_after(retry_after_s),
        )
        self.retry_after_s = retry_after_s


class SchedulerStopped(SchedulerError):
    """The scheduler shut down while the request was still waiting."""

    code = "shutting_down"

    def __init__(self) -> None:
        super().__init__(
            "The runner is shutting down; retry on another replica",
            headers=_retry_after(1),
        )


class ModelNotLoaded(SchedulerError):
    """The model is neither ready nor loading, and its policy does not load it on demand."""

    status = 404
    code = "model_not_loaded"
    type = "invalid_request_error"

    def __init__(self, model: str) -> None:
        super().__init__(
            f"Model {model!r} is not loaded; load it with POST /v1/models/load",
            extra={"model": model},
        )


class ModelLoadFailed(SchedulerError):
    """The load this request waited for failed."""

    code = "model_load_failed"

    def __init__(self, model: str, reason: str) -> None:
        super().__init__(
            f"Model {model!r} failed to load: {reason}", extra={"model": model, "reason": reason}
        )


class ModelDoesNotFit(SchedulerError):
    """The model cannot be loaded: even evicting every evictable model leaves too little memory."""

    code = "model_does_not_fit"

    def __init__(self, model: str, reason: str) -> None:
        super().__init__(
            f"Model {model!r} does not fit: {reason}", extra={"model": model, "reason": reason}
        )


class ModelUnloading(SchedulerError):
    """The model is being unloaded (or was evicted) while the request waited for it."""

    code = "model_unloading"

    def __init__(self, model: str, why: str = "it is being unloaded") -> None:
        super().__init__(
            f"Model {model!r} is not taking requests: {why}",
            extra={"model": model},
        )


class ModelEngineCrashed(SchedulerError):
    """The model's engine died while the request waited for it (no restart policy)."""

    status = 502
    code = "engine_crashed"

    def __init__(self, model: str, reason: str) -> None:
        super().__init__(
            f"The engine for model {model!r} crashed: {reason}",
            extra={"model": model, "reason": reason},
        )
