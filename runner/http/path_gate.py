"""What a request path asks on its way to an engine, handed down to it by the wiring (the
path never calls back into the front-end that called it, runner/http/frontend.py):

    check_model      the tenant's entitlement, the path that serves the model, and what
                     the scheduler would refuse it with now (the one ask of the model
                     gate, `_refusal`)                                -> 403 / 400 / 404 / 503
    reserve_tokens   the request's bounds against its tenant's token budgets, waiting in
                     line under a disconnect watch                          -> 429 / 400 / 503
    admitted         the admission scope (runner/http/admitted.py: the job scope plus a
                     disconnect watch)                                    -> 503 + Retry-After
    engine_gone      what a granted request whose engine is gone gets (the same `_refusal`)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Protocol

from runner.errors import ModelNotFound, QuorumError, ServiceUnavailable, WrongEndpoint
from runner.http.admitted import Admitted
from runner.http.asgi import ClientGone, DisconnectWatch
from runner.http.call import UNKNOWN_MODEL, ClientCall
from runner.scheduler.grants import Admission, AdmissionRequest
from runner.telemetry.traced_requests import TracedBudgets
from runner.tenancy.token_budgets import Budgets
from tenants.errors import ModelNotAllowed

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


class PathGate:
    """The module docstring's four steps, for every request path."""

    __slots__ = ("admission", "budgets", "metrics", "path_of")

    def __init__(
        self,
        admission: CheckedAdmission,
        metrics: RequestMetrics,
        path_of: Callable[[str], str | None] = lambda _model: None,
        budgets: Budgets | TracedBudgets | None = None,
    ) -> None:
        """`path_of(model)` names the path kind that serves a model (`chat`, `audio`,
        `images`; None: unknown here, the scheduler says so); `budgets` the token
        budgets' store."""
        self.admission = admission
        self.metrics = metrics
        self.path_of = path_of
        self.budgets = budgets

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
        refusal = self._refusal(model)
        if refusal is None:
            return
        if not isinstance(refusal, ModelNotFound):
            raise refusal
        call.model = UNKNOWN_MODEL  # never a label a client chose
        if entitled.patterns is None:
            raise refusal
        known = str(refusal.fields.get("models", "")).split(", ")
        mine = ", ".join(entitled.filter(known)) or "none"
        raise ModelNotFound(model=model, models=mine) from None

    def engine_gone(self, model: str) -> QuorumError:
        """What a request granted a slot gets when its model's engine is gone before the
        request reached it (it died, and the scheduler hears of it a moment later): the
        scheduler's answer for the model now (503 `model_unavailable` with the reason and
        `Retry-After`), else 503 with `Retry-After: 1` (a restart is on its way). Never a
        502: nothing was sent to the engine."""
        refusal = self._refusal(model)
        if refusal is not None:
            return refusal
        error = ServiceUnavailable(f"model {model!r} is restarting; retry shortly")
        error.headers["Retry-After"] = "1"
        return error

    def _refusal(self, model: str) -> QuorumError | None:
        """What the scheduler would refuse a request for `model` with now (the model gate,
        `Scheduler.gate`), or None: the one place a request path asks it."""
        try:
            self.admission.check(model)
        except QuorumError as exc:
            return exc
        return None

    async def reserve_tokens(
        self,
        call: ClientCall,
        model: str,
        count: Callable[[], Awaitable[int | None]] | None = None,
    ) -> None:
        """Reserve the request's bounds (`call.spent`) against its tenant's token budgets
        (429, 400 or 503 when refused), waiting in line, under a disconnect watch, while
        only reservations in flight stand in the way (at most `Budgets.wait_s`, or its
        deadline: what is left of that goes on to the scheduler); the headers join the
        call's. A client gone while it waits: `ClientGone`, nothing reserved. `count`:
        the engine's count of the prompt, asked only where the bound does not fit
        (`Budgets.reserve`); the prompt's bound is then the count."""
        if self.budgets is None or not call.policy.token_budgets:
            return
        spent, meta = call.spent, call.meta
        wait_s = self.budgets.wait_s
        if meta.deadline_ms is not None:
            wait_s = min(wait_s, meta.deadline_ms / 1000)
        started = time.perf_counter()
        try:
            call.held, headers = await self.budgets.reserve(
                call.tenant,
                call.policy,
                model,
                spent.input_bound,
                spent.output_bound,
                priority=meta.priority,
                wait_s=wait_s,
                on_wait=lambda: _watch(call),
                count=count,
            )
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
        if call.held is not None:
            spent.input_bound = call.held.input_bound  # the count, where counted
        if call.watch is not None and meta.deadline_ms is not None:  # it waited
            waited_ms = round((time.perf_counter() - started) * 1000)
            call.meta = replace(meta, deadline_ms=max(1, meta.deadline_ms - waited_ms))

    def admitted(self, call: ClientCall, request: AdmissionRequest) -> Admitted:
        """`async with gate.admitted(call, request) as admitted:` (see `Admitted`)."""
        return Admitted(self.admission, self.metrics, call, request)


def _watch(call: ClientCall) -> None:
    """Watch the client while its request waits for its token budget (the watch goes on to
    its admission)."""
    task = asyncio.current_task()
    assert task is not None
    call.watch = DisconnectWatch(task)
    call.watch.start(call.scope, call.receive)
