"""The one request front-end the chat, audio and image paths share.

Every inference request goes the same way, whatever its path:

    1. identify: the runner's headers (400 naming the header), the body's media type
       (415 unless JSON, for the JSON paths), the tenant (`tenants.identity.Identity`: an
       API key, the gateway's fairness id, or X-Tenant-ID in open mode; 401/403/429)
                                                              `FrontEnd.__call__`;
       the tenant's policy as it is now (the request keeps it to the end) and the
       priority it is served at (its default, capped at its max: X-Effective-Priority)
    2. rate limit (tenants/)                       -> 429 + Retry-After, RateLimit-*
    3. the path's own work (`serve(call)`): a bounded body (`asgi.read_body`: 413), its
       fields, then what it asks of the gate it was handed (runner/http/path_gate.py,
       `PathGate`; never this front-end): the model (`check_model`: 403 for a model the
       tenant may not use, 400 for one another path serves, and what the scheduler would
       refuse it with: 404/503); token budgets (`reserve_tokens`: 429 + Retry-After,
       x-ratelimit-*)
    4. admission, under a disconnect scope (`PathGate.admitted`: the job scope plus a
       disconnect watch, runner/http/admitted.py): the scheduler's queue (429 / 503 +
       Retry-After); a client that goes away while queued is withdrawn, while served its
       handler is cancelled (the engine work stops)
    5. any error before the answer started: the runner's envelope with the request id,
       the queue wait and RateLimit-* (`send_error`); every request counted once
       (`Metrics.count_request`); what it cost (`runner/tenancy/guard.Spent`) settles
       its token reservation and goes to the usage (`_account`).

Per-request state travels in one record (`ClientCall`, runner/http/call.py), not in
arguments. Calls go one way: the app calls the front-end with a path's `serve`
(`FrontEnd.path`), the front-end calls `serve`, the path calls its gate.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import replace

from runner.errors import HTTP_ERRORS, UnsupportedMediaType, error_status
from runner.http.asgi import ASGIApp, ClientGone, Receive, Scope, Send, send_error
from runner.http.call import NO_MODEL, ClientCall, Headers, Serve
from runner.http.headers import DEFAULT_OBJECTIVES, new_request_id, parse_request_headers
from runner.http.path_gate import CheckedAdmission, PathGate, RequestMetrics
from runner.telemetry.traced_requests import TracedBudgets
from runner.tenancy.guard import request_headers
from runner.tenancy.token_budgets import Budgets
from runner.tenancy.usage import UsageRecorder
from tenants.config import TenantsConfig
from tenants.identity import Identity
from tenants.policy import effective_priority
from tenants.ratelimit import RateLimiter

__all__ = ["ASGIApp", "ClientCall", "FrontEnd", "Headers", "Serve"]


class FrontEnd:
    """Steps 1, 2 and 5 of the module docstring, for every request path; its gate (`gate`,
    steps 3 and 4) is handed down to the paths."""

    def __init__(
        self,
        admission: CheckedAdmission,
        limiter: RateLimiter,
        tenants: TenantsConfig,
        metrics: RequestMetrics,
        *,
        multi_tenant: bool = True,
        path_of: Callable[[str], str | None] = lambda _model: None,
        objectives: Mapping[bytes, str] = DEFAULT_OBJECTIVES,
        budgets: Budgets | TracedBudgets | None = None,
        usage: UsageRecorder | None = None,
        identity: Identity | None = None,
    ) -> None:
        """`path_of(model)` names the path kind that serves a model (`chat`, `audio`,
        `images`; None: unknown here, the scheduler says so); `objectives` maps the
        gateway's objective names to priorities (OBJECTIVE_PRIORITIES); `budgets` the
        token budgets' store, `usage` where billable usage is counted; `identity` decides
        who a request is (default: the tenants file's default mode)."""
        self.admission = admission
        self.limiter = limiter
        self.tenants = tenants
        self.metrics = metrics
        self.multi_tenant = multi_tenant
        self.objectives = objectives
        self.budgets = budgets
        self.usage = usage
        self.identity = identity or Identity(tenants, multi_tenant=multi_tenant)
        self.identify = self.identity.identify
        self.gate = PathGate(admission, metrics, path_of, budgets)

    def path(self, serve: Serve, *, json: bool = True) -> ASGIApp:
        """A request path as an ASGI app: every request through this front-end, then
        `serve` (`json`: as in `__call__`)."""
        return functools.partial(self, serve=serve, json=json)

    async def __call__(
        self, scope: Scope, receive: Receive, send: Send, serve: Serve, *, json: bool = True
    ) -> None:
        """`json`: the path's body is JSON (chat, images): any other media type is 415."""
        call: ClientCall | None = None
        try:
            meta = parse_request_headers(scope["headers"], self.objectives)  # 1
            if json and not meta.json_body:
                raise UnsupportedMediaType()
            call = ClientCall(scope, receive, send, meta, "_invalid")
            call.tenant = self.identify(
                meta.authorization,
                meta.tenant_header,
                meta.fairness_id,
                meta.gateway_secret,
                scope.get("client"),
            )
            self._police(call)
            call.limits += await self._rate_limit(call.tenant)  # 2
            status = await serve(call)  # 3, 4
        except ClientGone:
            status = 499
        except HTTP_ERRORS as exc:  # 5
            status = error_status(exc)
            if call is None:
                await send_error(send, exc, new_request_id())
            else:
                await send_error(send, exc, call.request_id, call.queue_wait_ms, call.limits)
        if call is None:
            self.metrics.count_request(NO_MODEL, "_invalid", status)
            return
        self.metrics.count_request(call.model, call.tenant, status)
        self._account(call, status)

    def _police(self, call: ClientCall) -> None:
        """The tenant's policy as it is now, and the priority the request is served at
        (`tenants.policy.effective_priority`; X-Effective-Priority on every answer)."""
        policy = call.policy = self.tenants.policy(call.tenant)
        meta = call.meta
        asked = meta.priority if meta.priority_asked else None
        priority = effective_priority(asked, policy.priority_default, policy.priority_max)
        if priority != meta.priority:
            call.meta = replace(meta, priority=priority)
        call.limits.append((b"x-effective-priority", _PRIORITY_BYTES[priority]))

    async def _rate_limit(self, tenant: str) -> Headers:
        """RateLimit-* and OpenAI's x-ratelimit-*-requests; 429 over the limit."""
        decision = await self.limiter.hit(tenant)
        headers = request_headers(decision)
        if decision is not None and not decision.allowed:
            self.metrics.count_rejection("rate_limited", tenant)
            error = self.limiter.exceeded(tenant, decision)
            error.headers.update((k.decode(), v.decode()) for k, v in headers)
            raise error
        return self.limiter.headers(decision) + headers

    def _account(self, call: ClientCall, status: int) -> None:
        """Step 5: what the request is charged (`guard.Spent.used`) replaces its token
        reservation and goes to the usage, with its outcome and times; a request taken as
        a job (202) is recorded when the job ends, as its synchronous form would be
        (`runner/jobs/http.job_submitter`)."""
        used_in, used_out = call.spent.used()
        if self.budgets is not None:
            self.budgets.settle(call.held, used_in, used_out)
        if self.usage is not None and call.model is not NO_MODEL and status != 202:
            self.usage.request(
                call.tenant,
                call.model,
                status,
                prompt=used_in,
                completion=used_out,
                cached=call.spent.cached,
                engine_ms=call.engine_ms,
                queue_ms=call.queue_wait_ms,
            )


_PRIORITY_BYTES = {p: p.encode() for p in ("low", "normal", "high")}
