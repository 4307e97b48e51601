"""`/v1/tenants` (governed policy changes, the list for admins) and `/v1/usage`.

    PUT    /v1/tenants/{id}   {"policy": {...}, "verifiedOpToken": ...}  -> 200 {version}
    DELETE /v1/tenants/{id}   {"verifiedOpToken": ...} (or X-Op-Token)   -> 200 {version}
    GET    /v1/tenants        admins: every policy, its source, version, who approved it
    GET    /v1/usage?from=&to=&tenant=&model=&group_by=hour|day
                              admins: everyone's; any other tenant: its own only

A change goes: 1. syntax only: the body is a JSON object of the known fields, `policy` an
object, the tenant id well-formed, a token present; anything else is one generic 400
(`INVALID`) or 401 missing_op_token, the same whatever tenants or keys exist; 2.
governance approves operation `tenant-policy` with params `{"tenantId", "policySha256"}`,
the SHA-256 of the policy's RFC 8785 form (`null` for a DELETE), M-of-N, audited, nonce
spent (runner/lifecycle/governed.py); 3. only now the policy's schema and the
configuration it makes (400 naming the field, or the key another tenant holds) and, for a
DELETE, whether the tenant has a policy here (404): told to approved callers only, their
token spent; 4. the store takes it with a new version, and every replica applies it
(runner/tenancy/live.py). Steps 1-2 run inside the lifecycle door's `attempt`: a refusal
there is audited and counts against its source (runner/http/control_plane.py).
"""

from __future__ import annotations

import time
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, Protocol

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from governance.encoding import policy_sha256
from governance.verifier import Approval
from runner.errors import BadRequest, Forbidden, MissingOpToken, NotFound, ServiceUnavailable
from runner.http.runner_view import RunnerView
from runner.lifecycle.governed import GovernedRequest
from tenants.config import parse_policy_document
from tenants.errors import InvalidTenantConfig
from tenants.policy_store import PolicyNotReplicated, PolicyRecord, PolicyStoreUnavailable
from tenants.rates import TENANT_ID
from tenants.usage import DAY, HOUR, hour_of, rows
from tenants.usage_store import UsageStoreUnavailable

MAX_BODY = 256 * 1024
INVALID = "not a well-formed tenant policy change (docs/tenants.md); nothing else was checked"
"""The one answer to a change that fails its syntax before approval (step 1)."""


class Door(Protocol):
    """The lifecycle door (runner/http/control_plane.py `LifecycleDoor`)."""

    def admit(self, request: Request) -> None: ...

    def attempt(self, request: Request, operation: str) -> AbstractAsyncContextManager[None]: ...


def _json(status: int, body: object) -> Response:
    return Response(orjson.dumps(body), status, media_type="application/json")


async def _body(request: Request) -> dict[str, Any]:
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise BadRequest(f"request body is larger than {MAX_BODY} bytes")
    if not raw.strip():
        return {}
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise BadRequest("request body must be a JSON object") from None
    if not isinstance(doc, dict):
        raise BadRequest("request body must be a JSON object")
    return doc


def _admin(rt: RunnerView, request: Request, what: str) -> str:
    tenant = rt.identify(request.scope)
    if tenant not in rt.settings.admins:
        raise Forbidden(f"{what} is readable by ADMIN_TENANTS only")
    return tenant


def _record_json(tenant: str, source: str, record: PolicyRecord | None, doc: object) -> object:
    return {
        "tenantId": tenant,
        "source": source,
        "version": record.version if record else 0,
        "policySha256": record.sha256 if record else policy_sha256(doc),
        "approvedBy": list(record.approved_by) if record else [],
        "updatedAt": record.updated_at if record else None,
        "policy": doc,
    }


def _time(value: str | None, name: str, default: int) -> int:
    """A query time: Unix seconds or RFC 3339 (`2026-01-01T00:00:00Z`)."""
    if value is None or value == "":
        return default
    try:
        if value.isdigit():
            return int(value)
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp())
    except (ValueError, OverflowError):
        raise BadRequest(f"{name} must be Unix seconds or an RFC 3339 time") from None


def mount_tenant_routes(app: FastAPI, rt: RunnerView, door: Door) -> None:
    """`door.admit(request)`: the lifecycle calls' per-source rate (429 before anything is
    read); `door.attempt`: refusals before approval audited and counted."""
    live = rt.tenancy.policies

    @app.get("/v1/tenants")
    async def list_tenants(request: Request) -> Response:
        _admin(rt, request, "the tenant list")
        config = live.current
        listed = []
        for tenant in sorted(set(config.documents) | set(live.records)):
            record = live.records.get(tenant)
            doc = record.policy if record else config.documents.get(tenant)
            listed.append(_record_json(tenant, "api" if record else "file", record, doc))
        return _json(200, {"version": live.version, "tenants": listed})

    @app.put("/v1/tenants/{tenant_id}")
    async def put_tenant(tenant_id: str, request: Request) -> Response:
        door.admit(request)
        async with door.attempt(request, "tenant-policy"):
            doc = await _syntax(request, tenant_id, {"policy", "verifiedOpToken"})  # 1
            policy = doc.get("policy")
            if not isinstance(policy, dict):
                raise BadRequest(INVALID)
            approval = await _approve(rt, tenant_id, request, policy, doc)  # 2
        _check(rt, tenant_id, policy)  # 3
        return await _store(rt, tenant_id, policy, approval.principals)  # 4

    @app.delete("/v1/tenants/{tenant_id}")
    async def delete_tenant(tenant_id: str, request: Request) -> Response:
        door.admit(request)
        async with door.attempt(request, "tenant-policy"):
            doc = await _syntax(request, tenant_id, {"verifiedOpToken"})  # 1
            approval = await _approve(rt, tenant_id, request, None, doc)  # 2
        current = live.records.get(tenant_id)  # 3
        if live.source(tenant_id) is None or (current is not None and current.policy is None):
            raise NotFound(f"tenant {tenant_id!r} has no policy here")
        return await _store(rt, tenant_id, None, approval.principals)  # 4

    @app.get("/v1/usage")
    async def usage(request: Request) -> Response:
        asker = rt.identify(request.scope)
        q = request.query_params
        tenant = q.get("tenant") or None
        if asker not in rt.settings.admins:
            if tenant is not None and tenant != asker:
                raise Forbidden("a tenant reads its own usage only")
            tenant = asker
        group_by = q.get("group_by", "hour")
        if group_by not in ("hour", "day"):
            raise BadRequest("group_by must be hour or day")
        now = time.time()
        end = _time(q.get("to"), "to", int(now) + 1)
        start = _time(q.get("from"), "from", end - DAY)
        retention = rt.settings.usage_retention_days * DAY
        if not start < end or end - start > retention + DAY:
            raise BadRequest("from must be before to, at most the retention apart")
        recorder = rt.tenancy.usage
        try:
            await recorder.flush()
            hours = await recorder.store.query(
                hour_of(start), hour_of(end - 1) + HOUR, tenant, q.get("model") or None
            )
        except UsageStoreUnavailable:
            raise ServiceUnavailable("usage store unreachable; retry shortly") from None
        return _json(200, {"object": "list", "groupBy": group_by, "data": rows(hours, group_by)})


async def _syntax(request: Request, tenant: str, fields: set[str]) -> dict[str, Any]:
    """Step 1: the body and the tenant id, read as text alone (one generic 400)."""
    try:
        doc = await _body(request)
    except BadRequest as exc:
        raise BadRequest(INVALID) from exc
    if set(doc) - fields or TENANT_ID.fullmatch(tenant) is None:
        raise BadRequest(INVALID)
    return doc


def _check(rt: RunnerView, tenant: str, policy: dict[str, Any]) -> None:
    """Step 3: the policy's schema, and the configuration it would make."""
    try:
        parse_policy_document(tenant, policy)
        rt.tenancy.policies.check(tenant, policy)
    except (InvalidTenantConfig, ValueError) as exc:
        raise BadRequest(str(exc)) from None


async def _approve(
    rt: RunnerView,
    tenant: str,
    request: Request,
    policy: dict[str, Any] | None,
    doc: dict[str, Any],
) -> Approval:
    """Step 2."""
    try:
        sha = policy_sha256(policy)
    except ValueError as exc:  # a value RFC 8785 has no form for
        raise BadRequest(INVALID) from BadRequest(str(exc))
    token = doc.get("verifiedOpToken")
    if token is None:
        token = request.headers.get("x-op-token")
    governed = GovernedRequest(None, {"tenantId": tenant, "policySha256": sha}, token)
    if governed.token is None:
        raise MissingOpToken()
    return await rt.governed.approve("tenant-policy", governed)


async def _store(
    rt: RunnerView, tenant: str, policy: dict[str, Any] | None, principals: tuple[str, ...]
) -> Response:
    """Step 4."""
    sha = policy_sha256(policy)
    try:
        record = await rt.tenancy.policies.put(tenant, policy, sha, principals)
    except PolicyNotReplicated:
        raise ServiceUnavailable(
            "tenant policy changed on the Redis primary but not acknowledged by the replicas "
            "asked for (NONCE_REPLICAS): a failover may undo it; read it back with GET, the "
            "token is spent"
        ) from None
    except PolicyStoreUnavailable:
        raise ServiceUnavailable("tenant policy store unreachable; the token is spent") from None
    return _json(
        200,
        {
            "tenantId": tenant,
            "version": record.version,
            "policySha256": sha,
            "approvedBy": list(principals),
            "deleted": policy is None,
        },
    )
