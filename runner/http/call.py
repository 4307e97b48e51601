"""One request on its way through a request path (`ClientCall`): the record the front-end
(runner/http/frontend.py) fills and hands down to the path, the gate
(runner/http/path_gate.py) and the admission scope (runner/http/admitted.py). Per-request
state travels in it, not in arguments."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from runner.http.asgi import DisconnectWatch, Receive, Scope, Send
from runner.http.headers import RequestMeta
from runner.scheduler.grants import AdmissionRequest, Grant
from runner.tenancy.guard import Headers as Headers  # the paths read it from here
from runner.tenancy.guard import Spent
from runner.tenancy.token_budgets import Held
from tenants.config import TenantPolicy

UNKNOWN_MODEL = "_unknown"
"""The model label of a request naming no model of this runner (no client-chosen labels)."""
NO_MODEL = ""
"""The `model` label of a request refused before its model was read (a bad header, the
rate limit, a body too large or not JSON): empty, which Prometheus reads as no label."""

NO_POLICY = TenantPolicy()  # a call's policy until the front-end reads its tenant's (frozen)


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
    policy: TenantPolicy = NO_POLICY  # as the request came in (`FrontEnd._police`)
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
            meta.request_id,
            self.model,
            self.tenant,
            meta.priority,
            cost_in,
            cost_out,
            meta.deadline_ms,
        )


Serve = Callable[[ClientCall], Awaitable[int]]
"""A path's work on an identified, rate-limited request; returns the status it answered."""
