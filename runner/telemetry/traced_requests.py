"""What the front-end decides, on the request's spans (tracing on only).

The front-end (runner/http/frontend.py) is handed these in place of the scheduler's
admission and the request metrics when tracing is on (`traced_admission`,
`traced_requests` hand back what they are given when it is off, so the hot path is as
it was):

- **admission**: a span around the wait for a slot: `quorum.priority.asked` (the header,
  when sent) and `quorum.priority` (what the tenant's policy granted), `quorum.deadline_ms`,
  `quorum.queue.wait_ms`, `quorum.admission.outcome` (`granted`, `cancelled` or the
  refusal's code, also its `error.type`);
- **the server span**: the tenant (`quorum.tenant`), the model (`gen_ai.request.model`)
  and the status as the front-end counted them, once per request;
- **the request-duration histogram**: a sampled request's duration is its bucket's
  exemplar (trace id, span id), on `/metrics` served as OpenMetrics.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, TypeVar

from runner.scheduler.grants import AdmissionRequest, Grant, Usage
from runner.telemetry import tracing


class _Admission(Protocol):
    async def acquire(self, request: AdmissionRequest) -> Grant: ...

    def release(self, grant: Grant, usage: Usage | None) -> None: ...

    def progress(self, grant: Grant, done: float) -> None: ...

    def queue_depth(self) -> int: ...

    def check(self, model: str) -> None: ...


class _Requests(Protocol):
    def count_request(self, model: str, tenant: str, status: int) -> None: ...

    def count_rejection(self, reason: str, tenant: str) -> None: ...

    def begin_request(self, model: str) -> None: ...

    def end_request(self, model: str, seconds: float) -> None: ...

    def end_request_traced(
        self, model: str, seconds: float, trace_id: str, span_id: str
    ) -> None: ...


A = TypeVar("A", bound=_Admission)
R = TypeVar("R", bound=_Requests)


class TracedAdmission:
    """`admission` with a span around each `acquire`."""

    def __init__(self, admission: _Admission) -> None:
        self.inner = admission

    async def acquire(self, request: AdmissionRequest) -> Grant:
        asked = getattr(tracing.current(), "attributes", None) or {}
        attributes: dict[str, str | int] = {
            "quorum.priority": request.priority,
            "gen_ai.request.model": request.model,
        }
        if "quorum.priority.asked" in asked:
            attributes["quorum.priority.asked"] = str(asked["quorum.priority.asked"])
        if request.deadline_ms is not None:
            attributes["quorum.deadline_ms"] = request.deadline_ms
        with tracing.span("admission", attributes) as span:
            try:
                grant = await self.inner.acquire(request)
            except asyncio.CancelledError:
                span.set_attribute("quorum.admission.outcome", "cancelled")
                raise
            except Exception as exc:
                code = str(getattr(exc, "code", type(exc).__name__))
                span.set_attribute("quorum.admission.outcome", code)
                tracing.failed(span, code)
                raise
            span.set_attribute("quorum.admission.outcome", "granted")
            span.set_attribute("quorum.queue.wait_ms", grant.queue_wait_ms)
            return grant

    def release(self, grant: Grant, usage: Usage | None) -> None:
        self.inner.release(grant, usage)

    def progress(self, grant: Grant, done: float) -> None:
        self.inner.progress(grant, done)

    def queue_depth(self) -> int:
        return self.inner.queue_depth()

    def check(self, model: str) -> None:
        self.inner.check(model)


class TracedRequests:
    """`metrics` whose `count_request` also names the request's tenant, model and status
    on its server span."""

    def __init__(self, metrics: _Requests) -> None:
        self.inner = metrics

    def count_request(self, model: str, tenant: str, status: int) -> None:
        self.inner.count_request(model, tenant, status)
        attributes: dict[str, str | int] = {"quorum.tenant": tenant, "quorum.status": status}
        if model:
            attributes["gen_ai.request.model"] = model
        tracing.annotate(attributes)

    def count_rejection(self, reason: str, tenant: str) -> None:
        self.inner.count_rejection(reason, tenant)

    def begin_request(self, model: str) -> None:
        self.inner.begin_request(model)

    def end_request(self, model: str, seconds: float) -> None:
        ids = tracing.sampled_ids()
        if ids is None:
            self.inner.end_request(model, seconds)
        else:
            self.inner.end_request_traced(model, seconds, *ids)


def traced_admission(admission: A) -> A | TracedAdmission:
    return TracedAdmission(admission) if tracing.on() else admission


def traced_requests(metrics: R) -> R | TracedRequests:
    return TracedRequests(metrics) if tracing.on() else metrics
