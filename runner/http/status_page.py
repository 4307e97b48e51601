"""The operators' status page: `GET /ui`, for the tenants ADMIN_TENANTS names.

    GET /ui              the page (runner/http/ui/index.html): plain HTML, CSS and JavaScript, no
                         build step; it fetches the state every 2 s and redraws itself
    GET /ui/app.js       its script;  GET /ui/style.css  its style sheet
    GET /ui/state.json   the state it shows (runner/telemetry/status_view.py)

Who may read it: the tenant identified as for inference (`Runtime.identify`: the API key,
or the gateway's fairness id), or, in keys mode so that a browser can sign in, HTTP Basic
credentials whose user is the tenant id and whose password is the tenant's API key
(checked, and throttled when they fail, as a bearer key is). No credentials at all: 401
with a Basic challenge; a tenant that is not an admin: 403. The runner refuses to start
with ADMIN_TENANTS in open mode, so an asserted X-Tenant-ID never reads it. Every answer
says `Cache-Control: no-store` and forbids framing and any script
not served from here.

What it reads of the runner (names kept in `gather`, so a refactor of the Runtime knows
what the page depends on): settings.runner_id, settings.admins, life, started_at,
admission.models() (the scheduler's view of each model: state, memory, restarts, exit code,
reason), specs.specs() (backend), pool.records (loaded_at), refresher.current (total/used/free_mb,
source, models: weights_mb, kv_mb, kv_utilization), loads.progress() (LoadTask),
admission.stats() (QueueStats), admission.core.waiting_tickets() (tenant, band, model: counts
only), verifier.audit_sink (records in memory, or the tail of the JSON Lines file),
tenants (identity; and each declared tenant's policy), admission.tenant_in_flight(),
tenancy.budgets.store.used() (the budgets' current windows, one read), tenancy.permits
(in flight across replicas, for shared caps).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import re
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from governance.audit import FileAuditSink, MemoryAuditSink
from runner.errors import Forbidden, LoginRequired, RouteNotFound
from runner.http.headers import parse_request_headers
from runner.http.runner_view import RunnerView
from runner.telemetry.status_view import (
    MAX_AUDIT,
    BudgetRow,
    LoadRow,
    ModelRow,
    PageInputs,
    TenantRow,
    Waiting,
    page_state,
)
from tenants.budget_store import BudgetStoreUnavailable
from tenants.budgets import counter_key, window
from tenants.errors import MissingApiKey, UnknownApiKey
from tenants.identity import IdentityMode
from tenants.permit_store import PermitStoreUnavailable

UI_DIR = Path(__file__).parent / "ui"
STATIC = {"app.js": "text/javascript", "style.css": "text/css"}
AUDIT_TAIL_BYTES = 64 * 1024
_TENANT = re.compile(r"[A-Za-z0-9._-]{1,64}")
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
}


def mount_status_page(app: FastAPI, rt: RunnerView) -> None:
    """Add the page's routes to the control plane."""

    @app.get("/ui")
    async def page(request: Request) -> Response:
        page_admin(rt, request)
        return _file("index.html", "text/html; charset=utf-8")

    @app.get("/ui/state.json")
    async def state(request: Request) -> Response:
        page_admin(rt, request)
        inputs = await gather(rt)
        return Response(orjson.dumps(page_state(inputs)), 200, SECURITY_HEADERS, "application/json")

    @app.get("/ui/{name}")
    async def static(name: str, request: Request) -> Response:
        page_admin(rt, request)
        if name not in STATIC:
            raise RouteNotFound(f"/ui/{name} does not exist")
        return _file(name, STATIC[name])


def _file(name: str, media_type: str) -> Response:
    return Response((UI_DIR / name).read_bytes(), 200, SECURITY_HEADERS, media_type)


def page_admin(rt: RunnerView, request: Request) -> str:
    """The admin tenant asking, or an error (401 challenge, 403).

    1. Keys mode, HTTP Basic credentials: the user is the tenant id (it must be
       well-formed), the password its API key; they are checked as X-Tenant-ID and a
       bearer key would be, by the one `Identity` (throttled alike: 429 past the quota).
    2. Otherwise the request as for inference (`Runtime.identify`).
    3. Keys mode and nothing that identifies anyone (no credentials, no X-Tenant-ID):
       401 with a Basic challenge, so a browser asks.
    4. A tenant that ADMIN_TENANTS does not name: 403.
    """
    scope = request.scope
    meta = parse_request_headers(list(scope["headers"]))
    keys = rt.identity.mode is IdentityMode.KEYS
    basic = _basic(meta.authorization) if keys else None
    if basic is not None:  # 1
        user, password = basic
        authorization = b"Bearer " + password.encode() if password else None
        try:
            tenant = rt.identity.identify(
                authorization, user.encode(), None, None, scope.get("client")
            )
        except (MissingApiKey, UnknownApiKey):
            raise LoginRequired() from None  # a browser asks again
    elif keys and meta.authorization is None and meta.tenant_header is None:  # 3
        raise LoginRequired()
    else:  # 2
        tenant = rt.identify(scope)
    if tenant not in rt.settings.admins:  # 4
        raise Forbidden("the status page is readable by ADMIN_TENANTS only")
    return tenant


def _basic(authorization: bytes | None) -> tuple[str, str] | None:
    scheme, _, value = (authorization or b"").strip().partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        user, sep, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        raise LoginRequired() from None
    if not sep or not _TENANT.fullmatch(user):
        raise LoginRequired()
    return user, password


async def gather(rt: RunnerView) -> PageInputs:
    """Everything the page shows, read from the Runtime now (see the module docstring)."""
    snapshot = rt.refresher.current
    measured = {m.model: m for m in snapshot.models}
    specs = rt.specs.specs()
    records = rt.pool.records
    waiting = rt.admission.core.waiting_tickets()
    stats = rt.admission.stats()
    audit, source = await _audit(rt)
    return PageInputs(
        runner_id=rt.settings.runner_id,
        life=rt.life.value,
        uptime_s=time.monotonic() - rt.started_at,
        memory_total_mb=snapshot.total_mb,
        memory_used_mb=snapshot.used_mb,
        memory_free_mb=snapshot.free_mb,
        memory_source=snapshot.source,
        models=[
            ModelRow(
                id=model,
                backend=specs[model].backend,
                state=view.state.value,
                mem_mb=view.mem_mb,
                weights_mb=measured[model].weights_mb if model in measured else None,
                kv_mb=measured[model].kv_mb if model in measured else None,
                kv_utilization=measured[model].kv_utilization if model in measured else None,
                restarts=view.restarts,
                exit_code=view.exit_code,
                error=view.reason,
                loaded_at=records[model].loaded_at if model in records else None,
            )
            for model, view in rt.admission.models().items()
            if model in specs
        ],
        loads=[
            LoadRow(t.task_id, t.model_id, t.status.value, t.progress, t.eta, t.created_at)
            for t in rt.loads.progress().values()
        ],
        queue_depth=stats.depth,
        queue_max_depth=stats.max_depth,
        avg_wait_ms=stats.avg_wait_ms,
        p95_wait_ms=stats.p95_wait_ms,
        in_flight=stats.in_flight,
        waiting=[Waiting(t.tenant, t.band.label, t.model) for t in waiting],
        audit=audit,
        audit_source=source,
        tenants=await _tenants(rt, {t.tenant for t in waiting}),
    )


async def _tenants(rt: RunnerView, waiting: set[str]) -> list[TenantRow]:
    """The declared tenants and any other with requests in flight or waiting: policy,
    in flight (here, and across replicas for a shared cap), each budget's window now."""
    config, now = rt.tenants, time.time()
    flight = rt.admission.tenant_in_flight()
    names = sorted(set(config.tenants) | set(flight) | waiting)
    windows = {
        (t, b.key): (counter_key(t, b, window(b.per, now)[0]), window(b.per, now)[1])
        for t in names
        for b in config.policy(t).token_budgets
    }
    keys = [key for key, _ in windows.values()]
    try:
        counts: list[int | None] = list(await rt.tenancy.budgets.store.used(keys, now))
    except BudgetStoreUnavailable:
        counts = [None] * len(keys)
    used = dict(zip(keys, counts, strict=True))
    permits = rt.tenancy.permits
    rows = []
    for t in names:
        policy = config.policy(t)
        shared = None
        if permits is not None and policy.max_in_flight is not None:
            with contextlib.suppress(PermitStoreUnavailable):
                shared = await permits.store.held(t)
        budgets = []
        for b in policy.token_budgets:
            key, end = windows[t, b.key]
            budgets.append(BudgetRow(b.text, b.tokens, b.per, b.count, b.model, used[key], end))
        priority = (policy.priority_default, policy.priority_max)
        cap = policy.max_in_flight
        patterns = policy.models.patterns
        rows.append(TenantRow(t, priority, patterns, flight.get(t, 0), shared, cap, budgets))
    return rows


async def _audit(rt: RunnerView) -> tuple[list[Mapping[str, Any]], str]:
    """The latest audit records: from memory, or from the tail of the JSON Lines file."""
    if rt.verifier is None:
        return [], "governance off"
    sink = rt.verifier.audit_sink
    if isinstance(sink, MemoryAuditSink):
        records = list(sink.records)[-MAX_AUDIT:]
        return [{**asdict(r), "params": dict(r.params)} for r in records], "memory"
    if isinstance(sink, FileAuditSink):
        return await asyncio.to_thread(_tail, sink.path), str(sink.path.name)
    return [], type(sink).__name__


def _tail(path: Path) -> list[Mapping[str, Any]]:
    """The last records of a JSON Lines file (a partial first line is skipped)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - AUDIT_TAIL_BYTES))
            data = f.read()
    except OSError:
        return []
    lines = data.splitlines()
    if size > AUDIT_TAIL_BYTES:
        lines = lines[1:]
    records: list[Mapping[str, Any]] = []
    for line in lines[-MAX_AUDIT:]:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            records.append(doc)
    return records
