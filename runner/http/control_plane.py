"""The control plane: health, capabilities, metrics, the model list, engine logs, cache
flush, governed load/unload tasks and async jobs, as a FastAPI app (a little framework cost
does not matter here; the inference paths are bare ASGI). Errors answer in the runner's
one envelope (runner/errors.py), unknown paths and wrong methods included.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match

from faults import QuorumError
from runner.engines.adapters import listed_to
from runner.errors import (
    HTTP_ERRORS,
    Forbidden,
    LifecycleRateLimited,
    ServiceUnavailable,
    error_body,
    error_headers,
    error_status,
    route_error,
)
from runner.http.asgi import read_body
from runner.http.headers import parse_request_headers
from runner.http.openapi import OPENAPI_PATH, openapi_json
from runner.http.runner_view import RunnerView
from runner.http.status_page import mount_status_page
from runner.http.tenant_routes import mount_tenant_routes
from runner.http.traced import FRAMEWORK_TELEMETRY_OFF
from runner.jobs.http import JOBS_PATH, delete_job, get_job
from runner.lifecycle.adapter_ops import adapter_entry
from runner.lifecycle.governed import APPROVED, GovernedOps
from runner.scheduler import ModelState
from runner.telemetry.capabilities import capabilities
from runner.telemetry.health import Life
from tenants.identity import Identity
from tenants.policy import EVERY_MODEL
from tenants.rates import parse_rate
from tenants.throttle import RecentEvents

JSON = "application/json"


def json_response(status: int, body: object, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status, headers=headers, media_type="application/json")


LIFECYCLE_MAX_BODY_BYTES = 64 * 1024
"""A lifecycle body (the seed's fields and a token of at most 16 KiB) fits in this; a larger
one is refused (413) before anything reads, parses or audits it."""


async def bounded_body(request: Request, limit: int) -> bytes:
    """The request body, read while it stays within `limit` bytes (413 once it does not):
    the one reader of the data paths (`asgi.read_body`)."""
    length = request.headers.get("content-length")
    declared = int(length) if length is not None and length.isdigit() else None
    return await read_body(request.receive, declared, limit)


class LifecycleDoor:
    """What every lifecycle call meets before its token is looked at, and what a call
    refused before approval costs its source.

    1. Its source address made LIFECYCLE_RATE_LIMIT calls lately: 429 with Retry-After
       (nothing read, verified or audited).
    2. A body above LIFECYCLE_MAX_BODY_BYTES: 413, before it is parsed or audited.
    3. Within `attempt`: a 4xx refusal before approval (its syntax, no token, governance's
       refusal; not 413 or 429) is audited (`GovernedOps.refused`) and counts as a failed
       authentication of its source (`Identity.failed`): past the source's quota it is
       answered 429 too_many_auth_failures instead. A call governance approved is never
       counted: the credential is checked before the throttle decides.
    """

    def __init__(self, rate: str, identity: Identity, governed: GovernedOps) -> None:
        self.calls = RecentEvents(parse_rate(rate), time.monotonic)
        self.identity = identity
        self.governed = governed

    def admit(self, request: Request) -> None:
        """Step 1 (also for the governed `/v1/tenants` routes, which keep their own cap)."""
        source = _source(request)
        wait = self.calls.retry_after(source)
        if wait:
            raise LifecycleRateLimited(rate=self.calls.rate.text, retry_after=wait)
        self.calls.add(source)

    async def body(self, request: Request) -> bytes:
        self.admit(request)  # 1
        return await bounded_body(request, LIFECYCLE_MAX_BODY_BYTES)  # 2

    @asynccontextmanager
    async def attempt(self, request: Request, operation: str) -> AsyncIterator[None]:
        """Step 3 around one governed call."""
        mark = APPROVED.set(False)
        try:
            yield
        except QuorumError as exc:
            if APPROVED.get() or not 400 <= exc.status < 500 or exc.status in (413, 429):
                raise
            source = _source(request)
            await self.governed.refused(operation, exc, source)
            self.identity.failed(source)  # 429 past the quota
            raise
        finally:
            APPROVED.reset(mark)


def _source(request: Request) -> str:
    client = request.scope.get("client")
    return client[0] if client else ""


def control_plane(rt: RunnerView) -> FastAPI:
    app = FastAPI(
        title="Quorum runner",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        **FRAMEWORK_TELEMETRY_OFF,  # type: ignore[arg-type]  # the runner's own spans only
    )
    door = LifecycleDoor(rt.settings.lifecycle_rate_limit, rt.identity, rt.governed)

    for error_type in HTTP_ERRORS:

        @app.exception_handler(error_type)
        async def _error(_: Request, exc: Exception) -> Response:
            return Response(
                error_body(exc),
                error_status(exc),
                headers=error_headers(exc),
                media_type="application/json",
            )

    @app.exception_handler(StarletteHTTPException)
    async def _framework_error(request: Request, exc: StarletteHTTPException) -> Response:
        # Unknown paths and wrong methods answer in the same envelope as everything else.
        error = route_error(exc.status_code, str(exc.detail))
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # every route of the path, not only the first one found
            headers["Allow"] = allowed_methods(app, request)
        return Response(error_body(error), error.status, headers=headers, media_type=JSON)

    @app.exception_handler(Exception)
    async def _internal_error(_: Request, exc: Exception) -> Response:
        # A bug: logged with its traceback (error_body), answered in the envelope, never shown.
        return Response(error_body(exc), 500, media_type=JSON)

    @app.get("/health")
    async def get_health() -> Response:
        report = rt.health()
        return json_response(report.status_code, report.body, starting_headers(rt))

    @app.get("/health/live")
    async def get_live() -> Response:
        # Liveness (deploy/k8s): the process answers. It reads no engine, queue or store, so
        # a slow engine, a full queue or Redis down never gets a runner restarted.
        return json_response(200, {"status": "alive"})

    @app.get("/v1/capabilities")
    async def get_capabilities(request: Request) -> Response:
        available: Sequence[str] = rt.refresher.current.available
        asker = asking_tenant(rt, request)
        admins = rt.settings.admins
        adapters = [a for a in rt.pool.adapters if listed_to(a, asker, admins)]
        if asker is not None:  # the router asks as nobody: it sees every model
            entitled = rt.tenants.policy(asker).models
            available = entitled.filter(available)
            if asker not in admins:
                adapters = [a for a in adapters if entitled.allows(a.adapter.id)]
        doc = capabilities(
            rt.settings.runner_id,
            str(rt.health().body["status"]),
            rt.admission.models(),
            rt.specs.specs(),
            rt.pool.records,
            rt.admission.stats().capabilities(),
            rt.settings.enable_multi_tenant,
            rt.features_of,
            loading=rt.loading(),
            available=available,
            resources=rt.refresher.current,
            engines=rt.watch.loads,
            versions=rt.watch.versions,
            adapters=[adapter_entry(a, rt.adapter_ops.loaded(a)) for a in adapters],
            audit=rt.verifier.audit_sink.published() if rt.verifier is not None else None,
        )
        doc["identity"] = rt.identity.mode.value  # who decides the tenant (docs/security.md)
        status = 200 if rt.life is Life.READY else 503
        return json_response(status, doc, {"Cache-Control": "max-age=5", **starting_headers(rt)})

    async def get_metrics(request: Request) -> Response:
        """`/metrics` and the picker's path when the bare path (runner/http/app.py) did not answer:
        ENABLE_METRICS=false."""
        if not rt.settings.enable_metrics:
            raise ServiceUnavailable("metrics are disabled (ENABLE_METRICS=false)")
        exposition = rt.metrics.paths[request.scope["path"]]
        return Response(exposition.render(), 200, media_type=rt.metrics.content_type)

    for (
        path
    ) in rt.api_metric_paths():  # `/metrics` (unless METRICS_ON_API_PORT=false), the picker's
        app.add_api_route(path, get_metrics, methods=["GET"])

    @app.post("/v1/cache/flush")
    async def cache_flush(request: Request) -> Response:
        body = await door.body(request)
        async with door.attempt(request, "cache-flush"):
            answer = await rt.governed.flush(body, request.headers.get("x-op-token"))
        return json_response(200, answer)

    @app.post("/v1/models/load")
    async def load_model(request: Request) -> Response:
        body = await door.body(request)
        async with door.attempt(request, "model-load"):
            task = await rt.loads.submit(body, request.headers.get("x-op-token"))
        return json_response(
            202, task.accepted_json(), {"Location": f"/v1/models/load/{task.task_id}"}
        )

    @app.get("/v1/models/load/{task_id}")
    async def load_status(task_id: str) -> Response:
        return json_response(200, (await rt.loads.get(task_id)).to_json())

    @app.delete("/v1/models/load/{task_id}")
    async def load_cancel(task_id: str, request: Request) -> Response:
        body = await door.body(request)
        async with door.attempt(request, "task-cancel"):
            task = await rt.loads.cancel(task_id, body, request.headers.get("x-op-token"))
        return json_response(200, task.to_json())

    @app.post("/v1/models/unload")
    async def unload_model(request: Request) -> Response:
        body = await door.body(request)
        async with door.attempt(request, "model-unload"):
            result = await rt.loads.unload(body, request.headers.get("x-op-token"))
        answer: dict[str, object] = {
            "modelId": result.model_id,
            "gpuMemoryFreedMB": result.freed_mb,
            "kvCacheFlushed": result.kv_cache_flushed,
        }
        if result.mode != "stop":
            answer["mode"] = result.mode
        return json_response(200, answer)

    @app.post("/v1/adapters/load")
    async def load_adapter(request: Request) -> Response:
        body = await door.body(request)
        async with door.attempt(request, "adapter-load"):
            answer = await rt.adapter_ops.load(body, request.headers.get("x-op-token"))
        return json_response(200, answer)

    @app.post("/v1/adapters/unload")
    async def unload_adapter(request: Request) -> Response:
        body = await door.body(request)
        async with door.attempt(request, "adapter-unload"):
            answer = await rt.adapter_ops.unload(body, request.headers.get("x-op-token"))
        return json_response(200, answer)

    @app.get(JOBS_PATH + "{job_id}")
    async def job_status(job_id: str, request: Request) -> Response:
        answer = await get_job(rt.jobs, job_id, rt.identify(request.scope))
        return json_response(answer.status, answer.body, answer.headers)

    @app.delete(JOBS_PATH + "{job_id}")
    async def job_cancel(job_id: str, request: Request) -> Response:
        answer = await delete_job(rt.jobs, job_id, rt.identify(request.scope))
        return json_response(answer.status, answer.body, answer.headers)

    @app.get("/v1/models")
    async def list_models(request: Request) -> Response:
        records = rt.pool.records
        asker = asking_tenant(rt, request)  # a router asks as nobody: it sees them all
        entitled = rt.tenants.policy(asker).models if asker is not None else EVERY_MODEL
        data: list[dict[str, object]] = [
            {"id": m, "object": "model", "created": records[m].loaded_at, "owned_by": "quorum"}
            for m, view in rt.admission.models().items()
            if view.state is ModelState.READY and m in records and entitled.allows(m)
        ]
        data += [  # an adapter: to the tenants bound to it and entitled to it, and admins
            {
                "id": a.adapter.id,
                "object": "model",
                "created": a.loaded_at or records[a.adapter.base].loaded_at,
                "owned_by": "quorum",
                "parent": a.adapter.base,
            }
            for a in rt.pool.adapters
            if rt.adapter_ops.loaded(a)
            and listed_to(a, asker, rt.settings.admins)
            and (entitled.allows(a.adapter.id) or asker in rt.settings.admins)
        ]
        return json_response(200, {"object": "list", "data": data})

    @app.get("/v1/models/{model_id:path}/logs")
    async def model_logs(model_id: str, request: Request) -> Response:
        admin_only(rt, request)
        lines = rt.pool.logs(model_id)
        return json_response(200, {"modelId": model_id, "lines": lines})

    contract = openapi_json([m.id for m in rt.models.models], rt.settings.picker_metrics_path)

    @app.get(OPENAPI_PATH)
    async def get_openapi() -> Response:
        # The hand-written contract (runner/http/openapi/): FastAPI's generator stays off, as it
        # sees neither the bare data path nor the raw bodies of the routes here.
        return Response(contract, 200, media_type="application/json")

    mount_status_page(app, rt)  # GET /ui: the operators' status page (admins only)
    mount_tenant_routes(app, rt, door)  # /v1/tenants, /v1/usage (runner/tenancy/)
    return app


def starting_headers(rt: RunnerView) -> dict[str, str]:
    """While the runner starts: `Retry-After`, the preloads' time left
    (runner/runtime/startup.py)."""
    if rt.life is not Life.STARTING:
        return {}
    return {"Retry-After": str(rt.preloads.retry_after_s())}


def allowed_methods(app: FastAPI, request: Request) -> str:
    """The `Allow` of a 405: the methods of every route whose path matches the request's."""
    methods: set[str] = set()
    for route in app.router.routes:
        if isinstance(route, BaseRoute) and route.matches(request.scope)[0] is Match.PARTIAL:
            methods.update(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


def asking_tenant(rt: RunnerView, request: Request) -> str | None:
    """The tenant a request says it is (X-Tenant-ID, the fairness id or an API key),
    identified as for inference; None when it names nobody."""
    meta = parse_request_headers(list(request.scope["headers"]))
    if meta.tenant_header is None and meta.authorization is None and meta.fairness_id is None:
        return None
    return rt.identify(request.scope)


def admin_only(rt: RunnerView, request: Request) -> None:
    """Engine logs are for the tenants ADMIN_TENANTS names (identified as for inference)."""
    if rt.identify(request.scope) not in rt.settings.admins:
        raise Forbidden("engine logs are readable by ADMIN_TENANTS only")
