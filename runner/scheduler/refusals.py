"""Whether a request that cannot be granted at once may wait, or is refused now (pure).

`core.Scheduler.on_request` asks it for a request it could not grant on arrival (steps 3
to 5 of its docstring); the answer is the refusal, or None: the request waits. And what
a waiter older than the queue timeout is told.
"""

from __future__ import annotations

from collections.abc import Callable

from runner.scheduler.config import SchedulerConfig
from runner.scheduler.deadlines import deadline_refusal
from runner.scheduler.errors import QueueFull, QueueTimeout, SchedulerError, TenantQueueFull
from runner.scheduler.events import Ticket
from runner.scheduler.waiting import WaitingRoom


def wait_refusal(
    ticket: Ticket,
    config: SchedulerConfig,
    waiting: WaitingRoom,
    *,
    forecast_s: Callable[[], float | None],
    avg_wait_ms: Callable[[], int],
    retry_after: Callable[[], int],
) -> SchedulerError | None:
    """The refusal of a request that would wait, or None: it may wait.

    3. Its tenant at its queue cap: `TenantQueueFull`.
    4. The queue at `max_queue_depth`: `QueueFull`.
    5. A deadline the forecast wait exceeds (`deadlines.deadline_refusal`):
       `DeadlineUnreachable`, with the forecast and its own `Retry-After`.

    The inputs that cost something are asked only when needed: `forecast_s` for a request
    with a deadline, `avg_wait_ms` and `retry_after` for a refusal (`retry_after` books the
    refused client's return, so it is called once per refusal).
    """
    cap = config.tenant_queue_cap(ticket.tenant)  # 3
    mine = waiting.tenant_depth(ticket.tenant)
    if cap is not None and mine >= cap:
        return TenantQueueFull(
            tenant=ticket.tenant,
            tenantQueueDepth=mine,
            tenantMaxDepth=cap,
            retry_after=retry_after(),
        )
    depth = len(waiting)  # 4
    if depth >= config.max_queue_depth:
        return QueueFull(
            queueDepth=depth,
            maxDepth=config.max_queue_depth,
            avgWaitMs=avg_wait_ms(),
            retry_after=retry_after(),
        )
    deadline_ms = ticket.request.deadline_ms  # 5
    if deadline_ms is None:
        return None
    return deadline_refusal(forecast_s(), deadline_ms)


def queue_timeout(ticket: Ticket, now: float, timeout_s: float, retry_after: int) -> SchedulerError:
    """503 `queue_timeout` for a waiter older than the queue timeout."""
    waited_ms = round(1000 * (now - ticket.arrived_at))
    return QueueTimeout(
        queueWaitMs=waited_ms, queueTimeoutMs=round(1000 * timeout_s), retry_after=retry_after
    )
