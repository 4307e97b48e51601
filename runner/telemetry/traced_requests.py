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
  exemplar (trace id, span id), on `/metrics` served as OpenMetrics;
- **token budgets** (`traced_budgets`, runner/tenancy/guard.py): a span
  `token budget reserve` around the reservation: the tenant (`quorum.tenant`), the model,
  the request's bounds (`quorum.budget.input_bound`, `.output_bound`, `.tokens_reserved`),
  how many of the tenant's budgets it was charged against (`quorum.budget.budgets`), the
  tokens left in the tightest after it (`quorum.budget.remaining`) and
  `quorum.budget.outcome`: `reserved`, `none` (no reservation: no budget applies, or the
  store was unreachable and TOKEN_BUDGET_FAIL_OPEN let it through) or the refusal's code
  (`token_budget_exceeded`, `request_exceeds_budget`, `token_budget_unavailable`, also its
  `error.type`); the settlement, an event `token budget settled` on the request's span:
  the tenant, the tokens reserved and those charged (`quorum.budget.tokens_settled`, with
  its `input_tokens` and `output_tokens`), `quorum.budget.outcome`: `settled`, or
  `above_bound` when it used more than it reserved. Token counts only: nothing a tenant
  sent.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol, TypeVar

from runner.scheduler.grants import AdmissionRequest, Grant, Usage
from runner.telemetry import tracing
from runner.tenancy.guard import Headers
from runner.tenancy.token_budgets import Budgets, Held
from tenants.config import TenantPolicy


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
B = TypeVar("B", bound=Budgets)
_REMAINING = b"x-ratelimit-remaining-tokens"


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


class TracedBudgets:
    """`budgets` whose reservations are spans and settlements events (module docstring)."""

    def __init__(self, budgets: Budgets) -> None:
        self.inner = budgets
        self.wait_s = budgets.wait_s

    async def reserve(
        self,
        tenant: str,
        policy: TenantPolicy,
        model: str,
        input_bound: int,
        output_bound: int,
        **waiting: Any,
    ) -> tuple[Held | None, Headers]:
        attributes: dict[str, str | int] = {
            "quorum.tenant": tenant,
            "gen_ai.request.model": model,
            "quorum.budget.input_bound": input_bound,
            "quorum.budget.output_bound": output_bound,
            "quorum.budget.tokens_reserved": input_bound + output_bound,
        }
        with tracing.span("token budget reserve", attributes) as span:
            try:
                held, headers = await self.inner.reserve(
                    tenant, policy, model, input_bound, output_bound, **waiting
                )
            except Exception as exc:
                code = str(getattr(exc, "code", type(exc).__name__))
                span.set_attribute("quorum.budget.outcome", code)
                tracing.failed(span, code)
                raise
            span.set_attribute("quorum.budget.outcome", "none" if held is None else "reserved")
            if held is not None:  # the prompt's bound is the engine's count, where counted
                span.set_attribute("quorum.budget.budgets", len(held.reservation.charges))
                span.set_attribute("quorum.budget.input_bound", held.input_bound)
                span.set_attribute(
                    "quorum.budget.tokens_reserved", held.input_bound + held.output_bound
                )
            for name, value in headers:
                if name == _REMAINING:
                    span.set_attribute("quorum.budget.remaining", int(value))
            return held, headers

    def settle(self, held: Held | None, used_in: int, used_out: int) -> None:
        if held is not None and not held.settled:
            above = used_in > held.input_bound or used_out > held.output_bound
            tracing.event(
                "token budget settled",
                {
                    "quorum.tenant": held.reservation.tenant,
                    "quorum.budget.tokens_reserved": held.input_bound + held.output_bound,
                    "quorum.budget.tokens_settled": used_in + used_out,
                    "quorum.budget.input_tokens": used_in,
                    "quorum.budget.output_tokens": used_out,
                    "quorum.budget.outcome": "above_bound" if above else "settled",
                },
            )
        self.inner.settle(held, used_in, used_out)


def traced_admission(admission: A) -> A | TracedAdmission:
    return TracedAdmission(admission) if tracing.on() else admission


def traced_requests(metrics: R) -> R | TracedRequests:
    return TracedRequests(metrics) if tracing.on() else metrics


def traced_budgets(budgets: B | None) -> B | TracedBudgets | None:
    return TracedBudgets(budgets) if budgets is not None and tracing.on() else budgets
