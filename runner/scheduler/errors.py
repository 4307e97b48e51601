"""Why the scheduler refused or dropped a request: one row per refusal.

Exception tree::

    ServiceUnavailable (faults)      503
    └── SchedulerError               503  scheduler_error (base)
        ├── QueueFull                503  queue_full: MAX_QUEUE_DEPTH requests already wait
        ├── TenantQueueFull          503  tenant_queue_full: this tenant's queue cap is reached
        ├── QueueTimeout             503  queue_timeout: waited longer than QUEUE_TIMEOUT_MS
        ├── SchedulerStopped         503  shutting_down: the runner stopped while it waited
        ├── DeadlineUnreachable      503  deadline_unreachable: the forecast wait exceeds the
        │                                 request's deadline (refused on arrival)
        ├── DeadlinePassed           504  deadline_exceeded: the deadline passed while it waited
        ├── ModelNotLoaded           404  model_not_loaded: not resident, not loading, not autoload
        ├── ModelLoadFailed          503  model_load_failed: the load it waited for failed
        ├── ModelDoesNotFit          503  model_does_not_fit: no eviction can make room
        ├── ModelUnloading           503  model_unloading: unloaded or evicted
        └── ModelFailed              503  model_unavailable: its engine failed (no restart)

Every refusal a client may retry carries `Retry-After` (the `retry_after` field, seconds:
for the queue ones when a place opens, `retry_after.retry_after_s`; from the model's state
for the others); the model ones carry `model` (and `reason`) in the envelope.
`DeadlinePassed` carries none: the client's own deadline has passed, so no retry can meet
it. Which model state gives which row is decided in one place, `models.admission`
(`models.unload_refusal` for an unload, `models.cut_short` for a request cut by a drain
timeout); `docs/api.md` lists it. A model that is not in the catalog is `runner.errors`'s
404 `model_not_found`.
"""

from __future__ import annotations

from faults import ServiceUnavailable


class SchedulerError(ServiceUnavailable):
    """Root of the scheduler's refusals; `Retry-After` from the `retry_after` field."""

    code, retry_after = "scheduler_error", True


QueueFull = SchedulerError.row(
    "QueueFull",
    "queue_full",
    None,
    "Queue depth {queueDepth}/{maxDepth}, retry in {retry_after} seconds",
    extra=("queueDepth", "avgWaitMs"),
)
TenantQueueFull = SchedulerError.row(
    "TenantQueueFull",
    "tenant_queue_full",
    None,
    "Tenant {tenant!r} has {tenantQueueDepth}/{tenantMaxDepth} requests queued, "
    "retry in {retry_after} seconds",
    extra=("tenant", "tenantQueueDepth", "tenantMaxDepth"),
)
QueueTimeout = SchedulerError.row(
    "QueueTimeout",
    "queue_timeout",
    None,
    "Waited {queueWaitMs} ms in the queue (limit {queueTimeoutMs} ms), "
    "retry in {retry_after} seconds",
    extra=("queueWaitMs", "queueTimeoutMs"),
)
DeadlineUnreachable = SchedulerError.row(
    "DeadlineUnreachable",
    "deadline_unreachable",
    None,
    "The forecast wait of {forecastWaitMs} ms exceeds the deadline of {deadlineMs} ms, "
    "retry in {retry_after} seconds or on another replica",
    extra=("forecastWaitMs", "deadlineMs"),
)
DeadlinePassed = SchedulerError.row(
    "DeadlinePassed",
    "deadline_exceeded",
    504,
    "The deadline of {deadlineMs} ms passed after {queueWaitMs} ms in the queue",
    extra=("queueWaitMs", "deadlineMs"),
    retry_after=False,
)
SchedulerStopped = SchedulerError.row(
    "SchedulerStopped",
    "shutting_down",
    None,
    "The runner is shutting down; retry on another replica",
)
ModelNotLoaded = SchedulerError.row(
    "ModelNotLoaded",
    "model_not_loaded",
    404,
    "Model {model!r} is not loaded; load it with POST /v1/models/load (governed)",
    extra=("model",),
    retry_after=False,
)
ModelLoadFailed = SchedulerError.row(
    "ModelLoadFailed",
    "model_load_failed",
    None,
    "Model {model!r} failed to load: {reason}",
    extra=("model", "reason"),
)
ModelDoesNotFit = SchedulerError.row(
    "ModelDoesNotFit",
    "model_does_not_fit",
    None,
    "Model {model!r} does not fit: {reason}",
    extra=("model", "reason"),
)
ModelUnloading = SchedulerError.row(
    "ModelUnloading",
    "model_unloading",
    None,
    "Model {model!r} is not taking requests: {reason}",
    extra=("model",),
)
ModelFailed = SchedulerError.row(
    "ModelFailed",
    "model_unavailable",
    None,
    "Model {model!r} is unavailable: {reason}",
    extra=("model", "reason"),
)
