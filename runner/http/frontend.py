"""The one request front-end the chat, audio and image paths share.

Every inference request goes the same way, whatever its path:

    1. identify: the runner's headers (400 naming the header), the body's media type
       (415 unless JSON, for the JSON paths), the tenant (`tenants.identity.Identity`: an
       API key, the gateway's fairness id, or X-Tenant-ID in open mode; 401/403/429)
                                                              `FrontEnd.__call__`;
       the tenant's policy as it is now (the request keeps it to the end) and the
       priority it is served at (its default, capped at its max: X-Effective-Priority)
    2. rate limit (tenants/)                       -> 429 + Retry-After, RateLimit-*
    3. the path's own work (`serve(call)`): a bounded body (`read_body`: 413), its
       fields, the model (`check_model`: 403 for a model the tenant may not use, 400
       for one another path serves, and what the scheduler would refuse it with:
       404/503); token budgets (`reserve_tokens`: 429 + Retry-After, x-ratelimit-*)
    4. admission, under a disconnect scope (`admitted`): the scheduler's queue (429 /
       503 + Retry-After); a client that goes away while queued is withdrawn, while
       served its handler is cancelled (the engine work stops)
    5. any error before the answer started: the runner's envelope with the request id,
       the queue wait and RateLimit-* (`send_error`); every request counted once
       (`Metrics.count_request`); what it cost (`runner/tenancy/guard.Spent`) settles
       its token reservation and goes to the usage (`_account`).

Per-request state travels in one record (`ClientCall`), not in arguments.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from runner.errors import (
    HTTP_ERRORS,
    ModelNotFound,
    QuorumError,
    ServiceUnavailable,
    UnsupportedMediaType,
    WrongEndpoint,
    error_status,
)
from runner.http.admitted import Admitted
from runner.http.asgi import (
    ClientGone,
    DisconnectWatch,
    Receive,
    Scope,
    Send,
    read_body,
    send_error,
)
from runner.http.headers import (
    DEFAULT_OBJECTIVES,
    RequestMeta,
    new_request_id,
    parse_request_headers,
)
from runner.scheduler.grants import Admission, AdmissionRequest, Grant
from runner.telemetry.traced_requests import TracedBudgets
from runner.tenancy.guard import Spent, request_headers
from runner.tenancy.token_budgets import Budgets, Held
from runner.tenancy.usage import UsageRecorder
from tenants.config import TenantPolicy, TenantsConfig
from tenants.errors import ModelNotAllowed
from tenants.identity import Identity
from tenants.policy import effective_priority
from tenants.ratelimit import RateLimiter

Headers = list[tuple[bytes, bytes]]

UNKNOWN_MODEL = "_unknown"
"""The model label of a request naming no model of this runner (no client-chosen labels)."""
NO_MODEL = ""
"""The `model` label of a request refused before its model was read (a bad header, the
rate limit, a body too large or not JSON): empty, which Prometheus reads as no label."""

NO_POLICY = TenantPolicy()  # a call's policy until `_police` reads its tenant's (frozen)

PATHS = {
    "chat": "POST /v1/chat/completions, /v1/completions or /v1/embeddings",
    "audio": "POST /v1/audio/transcriptions or /v1/audio/translations",
    "images": "POST /v1/images/generations",
}
"""Where to send a model of each request path (its kind's `Traits.request_path`)."""
_KINDS = {"chat": "a text model", "audio": "a speech model", "images": "an image model"}


class RequestMetrics(Protocol):
    def count_request(self, model: str, tenant: str, status: int) -> None: ...

    def count_rejection(self, reason: str, tenant: str) -> None: ...

    def begin_request(self, model: str) -> None: ...

    def end_request(self, model: str, seconds: float) -> None: ...


class CheckedAdmission(Admission, Protocol):
    """The scheduler's admission (`SchedulerAdmission`): grants and releases slots, and
    says what a request for a model would be refused with now."""

    def check(self, model: str) -> None:
        """Raise what a request for `model` would be refused with now."""
        ...


@dataclass(slots=True)
class ClientCall:
    """One request through the front-end: who sent it, and how far it got."""

    scope: Scope
    receive: Receive
    send: Send
    meta: RequestMeta
    tenant: str
    limits: Headers = field(default_factory=list)  # RateLimit-*, x-ratelimit-*, priority
    model: str = NO_MODEL
    grant: Grant | None = None
    policy: TenantPolicy = NO_POLICY  # as the request came in (`_police`)
    held: Held | None = None  # its token reservation, until settled
    watch: DisconnectWatch | None = None  # started if it waited for its token budget
    spent: Spent = field(default_factory=Spent)  # what it cost (guard.Spent.used)
    engine_ms: int = 0
    first_byte: asyncio.Timeout | None = None  # its deadline's cut (runner/http/deadline.py)

    @property
    def request_id(self) -> str:
        return self.meta.request_id

    @property
    def queue_wait_ms(self) -> int:
        return self.grant.queue_wait_ms if self.grant is not None else 0

    def answering(self) -> None:
        """The answer's first byte leaves now: its deadline no longer cuts it."""
        if self.first_byte is not None:
            self.first_byte.reschedule(None)

    def header(self, name: bytes) -> str | None:
        """A request header (lower-case name), repeated values joined with `, `."""
        values = [v for k, v in self.scope["headers"] if k == name]
        return ", ".join(v.decode("latin-1") for v in values) if values else None

    def admission_request(self, cost_in: int, cost_out: int) -> AdmissionRequest:
        meta = self.meta
        return AdmissionRequest(
            meta.request_id, self.model, self.tenant, meta.priority, cost_in, cost_out,
            meta.deadline_ms,
        )  # fmt: skip


Serve = Callable[[ClientCall], Awaitable[int]]
"""A path's work on an identified, rate-limited request; returns the status it answered."""


class FrontEnd:
    """Steps 1, 2, 4 and 5 of the module docstring, for every request path."""

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
        self.path_of = path_of
        self.objectives = objectives
        self.budgets = budgets
        self.usage = usage
        self.identity = identity or Identity(tenants, multi_tenant=multi_tenant)
        self.identify = self.identity.identify

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

    async def reserve_tokens(self, call: ClientCall, model: str) -> None:
        """Reserve the request's bounds (`call.spent`) against its tenant's token budgets
        (429, 400 or 503 when refused), waiting in line, under a disconnect watch, while
        only reservations in flight stand in the way (at most `Budgets.wait_s`, or its
        deadline: what is left of that goes on to the scheduler); the headers join the
        call's. A client gone while it waits: `ClientGone`, nothing reserved."""
        if self.budgets is None or not call.policy.token_budgets:
            return
        spent, meta = call.spent, call.meta
        wait_s = self.budgets.wait_s
        if meta.deadline_ms is not None:
            wait_s = min(wait_s, meta.deadline_ms / 1000)
        started = time.perf_counter()
        try:
            call.held, headers = await self.budgets.reserve(
                call.tenant, call.policy, model, spent.input_bound, spent.output_bound,
                priority=meta.priority, wait_s=wait_s, on_wait=lambda: self._watch(call),
            )  # fmt: skip
        except QuorumError as exc:
            if exc.status == 429:
                self.metrics.count_rejection("token_budget", call.tenant)
            raise
        except asyncio.CancelledError:
            if call.watch is None or not call.watch.gone:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            raise ClientGone from None
        finally:
            if call.watch is not None:
                call.watch.disarm()
        call.limits += headers
        if call.watch is not None and meta.deadline_ms is not None:  # it waited
            waited_ms = round((time.perf_counter() - started) * 1000)
            call.meta = replace(meta, deadline_ms=max(1, meta.deadline_ms - waited_ms))

    @staticmethod
    def _watch(call: ClientCall) -> None:
        """Watch the client while its request waits for its token budget (the watch goes
        on to its admission)."""
        task = asyncio.current_task()
        assert task is not None
        call.watch = DisconnectWatch(task)
        call.watch.start(call.scope, call.receive)

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
                call.tenant, call.model, status, prompt=used_in, completion=used_out,
                cached=call.spent.cached, engine_ms=call.engine_ms,
                queue_ms=call.queue_wait_ms,
            )  # fmt: skip

    def check_model(
        self, call: ClientCall, model: str, kind: str, named: str | None = None
    ) -> None:
        """`model` is the call's: refused now if the tenant may not use it (403
        `model_not_allowed`, before any queueing), if another path serves it (400
        `unsupported_model` naming where to send it) or with what the scheduler would
        refuse it (404/503, naming only the models the tenant may use); admission
        decides again. `named`: the id the client sent when it is not `model` (a LoRA
        adapter served by base model `model`): the entitlement is checked on it."""
        entitled = call.policy.models
        if not entitled.allows(named or model):
            call.model = UNKNOWN_MODEL  # never a label a client chose
            allowed = ", ".join(entitled.patterns or ()) or "none"
            raise ModelNotAllowed(tenant=call.tenant, model=named or model, allowed=allowed)
        call.model = model
        path = self.path_of(model)
        if path is not None and path != kind:
            raise WrongEndpoint(model=model, kind=_KINDS[path], where=PATHS[path])
        try:
            self.admission.check(model)
        except ModelNotFound as exc:
            call.model = UNKNOWN_MODEL  # never a label a client chose
            if entitled.patterns is None:
                raise
            known = str(exc.fields.get("models", "")).split(", ")
            mine = ", ".join(entitled.filter(known)) or "none"
            raise ModelNotFound(model=model, models=mine) from None

    def engine_gone(self, model: str) -> QuorumError:
        """What a request granted a slot gets when its model's engine is gone before the
        request reached it (it died, and the scheduler hears of it a moment later): the
        scheduler's answer for the model now (503 `model_unavailable` with the reason and
        `Retry-After`), else 503 with `Retry-After: 1` (a restart is on its way). Never a
        502: nothing was sent to the engine."""
        try:
            self.admission.check(model)
        except QuorumError as exc:
            return exc
        error = ServiceUnavailable(f"model {model!r} is restarting; retry shortly")
        error.headers["Retry-After"] = "1"
        return error

    async def read_body(self, call: ClientCall, limit: int) -> bytes:
        """The whole body, refused with 413 the moment it passes `limit` (`asgi.read_body`);
        a client gone meanwhile raises `ClientGone`."""
        return await read_body(call.receive, call.meta.content_length, limit)

    def admitted(self, call: ClientCall, request: AdmissionRequest) -> Admitted:
        """Step 4: `async with front.admitted(call, request) as grant:` (see `Admitted`)."""
        return Admitted(self, call, request)


_PRIORITY_BYTES = {p: p.encode() for p in ("low", "normal", "high")}
