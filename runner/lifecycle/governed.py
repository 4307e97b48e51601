"""Governed lifecycle operations: parse the request, have governance approve it, run it.

Every lifecycle call goes the same way:

    1. parse the body strictly (duplicate keys, NaN, floats -> 400) and check its fields'
       shapes (400): nothing that depends on what exists on the runner;
    2. find the token (`governed_request`): body field `verifiedOpToken`, else header
       `X-Op-Token` (401 if none);
    3. `GovernedOps.approve` → `Verifier.authorize(token, operation, modelId, params)`,
       where params are the body's other fields exactly as sent; governance decides
       400/401/403/409/413/503 and audits;
    4. only then check what it names exists (404) and execute what was approved. A
       caller without a valid token gets the same answer whatever model it names, so the
       model roots cannot be probed; a token approved for a model that is not there is
       spent (its signers approved a call that cannot run).

Every attempt is audited: governance audits what it decides (step 3); a call refused
before it (steps 1-2: its syntax, no token) is audited by `GovernedOps.refused`, with the
caller's address and without its body. `APPROVED` tells the caller (the control plane's
door) whether a refusal came before approval or after.

`POST /v1/cache/flush` is here (`GovernedOps.flush`); model load, unload and task cancel
(runner/lifecycle/loads.py) and adapter load and unload (runner/lifecycle/adapter_ops.py)
go the same way with their own parsing and execution.

A flush that names no model also reaches the prompt states saved on disk for models whose
engine is not running (warm prefixes, `adapters/llama_server/prefix_store.py`): a tenant's
or a tag's are removed there too, everything for `all`.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from adapters.base import FlushResult, FlushScope
from faults import QuorumError
from governance.audit import AuditRecord
from governance.encoding import loads_strict
from governance.errors import GovernanceError
from governance.verifier import Approval, Verifier, capped
from runner.errors import BadRequest, MissingOpToken, ModelNotFound, ServiceUnavailable
from runner.telemetry import tracing
from runner.telemetry.metrics import Metrics

_TENANT = re.compile(r"[A-Za-z0-9._-]{1,64}")
FLUSH_SCOPES = ("all", "model", "tenant", "tag")
_FLUSH_FIELDS = frozenset({"scope", "modelId", "tenantId", "tag", "verifiedOpToken"})

APPROVED: ContextVar[bool] = ContextVar("quorum_lifecycle_approved", default=False)
"""Set by `GovernedOps.approve` for the request (task) it approved."""

Flush = Callable[[FlushScope], Awaitable[FlushResult]]
"""One ready engine's cache flush (`adapters.kind.Launched.flush`)."""


@dataclass(frozen=True, slots=True)
class GovernedRequest:
    """A lifecycle request as governance sees it."""

    model_id: str | None
    params: dict[str, Any]
    token: object


def parse_body(body: bytes) -> dict[str, Any]:
    """Strict JSON object, or 400."""
    try:
        value = loads_strict(body)
    except ValueError as exc:
        raise BadRequest(f"request body is not valid strict JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadRequest("request body must be a JSON object")
    return value


def governed_request(doc: dict[str, Any], header_token: str | None) -> GovernedRequest:
    """Split a lifecycle body into modelId, params (the other fields as sent) and token."""
    model_id = doc.get("modelId")
    if model_id is not None and (not isinstance(model_id, str) or not model_id):
        raise BadRequest("modelId must be a non-empty string or null")
    token = doc.get("verifiedOpToken")
    if token is None:
        token = header_token
    if token is None:
        raise MissingOpToken()
    params = {k: v for k, v in doc.items() if k not in ("modelId", "verifiedOpToken")}
    return GovernedRequest(model_id, params, token)


def flush_scope(doc: dict[str, Any]) -> FlushScope:
    """Validate a flush body (the seed's fields only) into a scope (pure).

    1. Only known fields; `scope` one of all, model, tenant, tag.
    2. Each selector the scope needs is present and well-formed.
    """
    unknown = set(doc) - _FLUSH_FIELDS
    if unknown:
        raise BadRequest(f"unknown field(s) in flush request: {', '.join(sorted(unknown))}")
    scope = doc.get("scope")
    if scope not in FLUSH_SCOPES:
        raise BadRequest(f"scope must be one of {', '.join(FLUSH_SCOPES)}")
    model_id, tenant_id, tag = doc.get("modelId"), doc.get("tenantId"), doc.get("tag")
    if model_id is not None and (not isinstance(model_id, str) or not model_id):
        raise BadRequest("modelId must be a non-empty string or null")
    if tenant_id is not None and (
        not isinstance(tenant_id, str) or not _TENANT.fullmatch(tenant_id)
    ):
        raise BadRequest("tenantId must be 1-64 characters of A-Z a-z 0-9 . _ -")
    if tag is not None and (not isinstance(tag, str) or not 1 <= len(tag) <= 64):
        raise BadRequest("tag must be a string of 1-64 characters")
    if scope == "model" and model_id is None:
        raise BadRequest("scope 'model' needs modelId")
    if scope == "tenant" and tenant_id is None:
        raise BadRequest("scope 'tenant' needs tenantId")
    if scope == "tag" and tag is None:
        raise BadRequest("scope 'tag' needs tag")
    return FlushScope(scope, model_id, tenant_id, tag)


def loaded_engine(model_id: str, engines: Mapping[str, Flush]) -> Flush:
    """The flush of a loaded model's engine (404 otherwise); asked after approval only."""
    engine = engines.get(model_id)
    if engine is None:
        loaded = ", ".join(sorted(engines)) or "none"
        raise ModelNotFound(f"model {model_id!r} is not loaded; loaded models: {loaded}")
    return engine


def merge_flushes(results: list[FlushResult]) -> dict[str, object]:
    """The seed's flush answer over every engine asked."""
    body: dict[str, object] = {
        "flushed": any(r.flushed for r in results),
        "entriesRemoved": sum(r.entries_removed for r in results),
        "memoryFreedMB": sum(r.memory_freed_mb for r in results),
    }
    if not body["flushed"]:
        reasons = sorted({r.reason for r in results if r.reason})
        body["reason"] = "; ".join(reasons) if reasons else "no engine in scope"
    return body


class GovernedOps:
    """The governed operations of one runner: approve any of them; flush the cache."""

    def __init__(
        self,
        verifier: Verifier | None,
        flushes: Mapping[str, Flush],
        metrics: Metrics,
        at_rest: Callable[[FlushScope], int] = lambda _scope: 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`flushes`: the ready engines a cache flush addresses, by model (kept current by
        the pool); `at_rest(scope)` removes the saved states in `scope` of models not
        running (blocking file work: run in a thread) and says how many."""
        self.verifier = verifier
        self.flushes = flushes
        self.metrics = metrics
        self.at_rest = at_rest
        self.clock = clock

    async def approve(self, operation: str, request: GovernedRequest) -> Approval:
        """Step 3: governance decides; every decision is counted, and is a span of its
        own when tracing is on (the operation and the outcome: never the token)."""
        if self.verifier is None:
            raise ServiceUnavailable(
                "lifecycle operations are disabled: no signer registry (GOVERNANCE_REGISTRY)"
            )
        attributes = {"quorum.operation": operation}
        with tracing.span("governance approval", attributes) as span:
            try:
                approval = await self.verifier.authorize(
                    request.token, operation, request.model_id, request.params
                )
            except Exception as exc:
                code = str(getattr(exc, "code", "internal_error"))
                self.metrics.count_lifecycle(operation, code)
                tracing.failed(span, code)
                raise
            span.set_attribute("quorum.approval.outcome", "approved")
        self.metrics.count_lifecycle(operation, "approved")
        APPROVED.set(True)
        return approval

    async def refused(self, operation: str, error: QuorumError, source: str) -> None:
        """Audit a call refused before governance saw it (its syntax, no token): the
        reason and the caller's address, none of what it sent. Governance's own
        refusals are audited by the verifier; without a registry there is no log."""
        if isinstance(error, GovernanceError):
            return  # counted by `approve`, audited by the verifier
        self.metrics.count_lifecycle(operation, error.code)
        if self.verifier is None:
            return
        reason = error.__cause__ if isinstance(error.__cause__, QuorumError) else error
        record = AuditRecord(
            time=self.clock(),
            runner_id=self.verifier.runner_id,
            operation=operation,
            model_id=None,
            params={},
            outcome="rejected",
            reason=error.code,
            status=error.status,
            detail=capped(str(reason)),
            extra={"source": source},
        )
        await self.verifier.audit_sink.append(record)

    async def flush(self, body: bytes, header_token: str | None) -> dict[str, object]:
        doc = parse_body(body)  # 1
        scope = flush_scope(doc)
        request = governed_request(doc, header_token)  # 2
        await self.approve("cache-flush", request)  # 3
        if scope.model_id is not None:  # 4
            targets = [loaded_engine(scope.model_id, self.flushes)]
        else:
            targets = list(self.flushes.values())
        attributes: tracing.Attributes = {
            "quorum.flush.scope": scope.scope,
            "quorum.flush.engines": len(targets),
        }
        with tracing.span("cache flush", attributes) as span:
            if scope.model_id is not None:
                span.set_attribute("gen_ai.request.model", scope.model_id)
            results = [await flush(scope) for flush in targets]
            if scope.model_id is None:
                removed = await asyncio.to_thread(self.at_rest, scope)
                if removed:
                    results.append(FlushResult(True, removed, 0))
        return merge_flushes(results)
