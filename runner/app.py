"""The runner as one ASGI application.

Inference paths go straight to the bare data path (runner/proxy.py), the audio
paths to the bare audio path (runner/audio/handler.py); the control plane
(health, metrics, capabilities, model list, lifecycle, jobs) is a FastAPI app,
where a little framework cost does not matter. The runner handles the ASGI
lifespan itself: start-up attaches engines, starts the scheduler, the rate
limiter and the job manager; shutdown stops them after uvicorn has drained
in-flight requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from adapters.comfyui import FILES_PATH, IMAGES_PATH, ImageFiles, ImagesPath, job_submitter
from governance.verifier import Verifier
from runner.audio.handler import AUDIO_PATHS, AudioPath
from runner.audio.multipart import FormLimits
from runner.capabilities import capabilities
from runner.catalog import Roots, available
from runner.engine_watch import EngineWatch
from runner.errors import (
    HTTP_ERRORS,
    Forbidden,
    PayloadTooLarge,
    RouteError,
    RunnerError,
    ServiceUnavailable,
    error_body,
    error_headers,
    error_status,
)
from runner.headers import new_request_id, parse_request_headers
from runner.health import Life, health
from runner.images import image_routes, sweep_forever
from runner.jobs import JobManager, JobStore, MemoryJobStore, RedisJobStore, WebhookSender
from runner.jobs.http import JOBS_PATH, delete_job, get_job
from runner.lifecycle import Lifecycle
from runner.loads import LoadManager
from runner.memory.factory import telemetry_from_settings
from runner.memory.leases import LeaseStore, MemoryLeaseStore, RedisLeaseStore
from runner.memory.proc import tree_resident_mb
from runner.metrics import Metrics, SchedulerMetrics
from runner.models_config import ModelsFile, ModelSpec
from runner.pool.pool import ModelPool
from runner.pool.states import ModelState
from runner.proxy import INFERENCE_PATHS, DataPath, Receive, Scope, Send, send_error
from runner.scheduler import SchedulerAdmission, SchedulerConfig
from runner.settings import Settings
from runner.snapshot import Refresher, SnapshotCollector
from runner.tasks import MemoryTaskStore, RedisTaskStore, TaskStore
from tenants.config import TenantsConfig
from tenants.identity import DEFAULT_TENANT, resolve_tenant
from tenants.ratelimit import RateLimiter
from tenants.storage import storage_from_url

log = logging.getLogger("quorum.app")


def scheduler_config(
    settings: Settings, pool: ModelPool, tenants: TenantsConfig
) -> SchedulerConfig:
    """The scheduler's limits from settings, the pool's models and the tenants' policies.

    Every model is managed (loaded, stopped, evicted by the scheduler's policy); an engine
    attached by URL is pinned with no memory of ours, and reported ready once attached.
    """
    policies = dict(tenants.tenants)
    return SchedulerConfig(
        max_queue_depth=settings.max_queue_depth,
        queue_timeout_s=settings.queue_timeout_ms / 1000,
        models={m: pool.policy(slot.spec) for m, slot in pool.slots.items()},
        unlisted_ready=False,
        drain_timeout_s=settings.unload_drain_timeout_s,
        tenant_weights={t: p.weight for t, p in policies.items()},
        default_weight=tenants.default.weight,
        tenant_queue_caps={t: p.max_queued for t, p in policies.items() if p.max_queued},
        default_tenant_queue_cap=tenants.default.max_queued,
        low_aging_s=settings.queue_low_aging_ms / 1000 or None,
    )


@dataclass
class Runtime:
    """Everything the runner holds while it lives; built once, read by handlers."""

    settings: Settings
    models: ModelsFile
    tenants: TenantsConfig = field(default_factory=TenantsConfig)
    metrics: Metrics = field(default_factory=Metrics)
    pool: ModelPool = field(init=False)
    loads: LoadManager = field(init=False)
    refresher: Refresher = field(init=False)
    roots: Roots = field(init=False)
    life: Life = Life.STARTING
    started_at: float = field(default_factory=time.monotonic)
    verifier: Verifier | None = None
    admission: SchedulerAdmission = field(init=False)
    limiter: RateLimiter | None = None
    lifecycle: Lifecycle = field(init=False)
    watch: EngineWatch = field(init=False)
    webhook_client: httpx.AsyncClient | None = None

    def __post_init__(self) -> None:
        s = self.settings
        self.telemetry = telemetry_from_settings(
            s.runner_memory_mb, s.cuda_visible_devices, measure=self._engines_memory_mb
        )
        leases: LeaseStore = (
            RedisLeaseStore.from_url(
                s.redis_url, prefix=f"quorum:mem:lease:{socket.gethostname()}:"
            )
            if s.redis_url
            else MemoryLeaseStore(time.monotonic)
        )
        self.pool = ModelPool(
            s,
            self.models,
            self.telemetry,
            multi_tenant=s.enable_multi_tenant,
            leases=leases,
            vllm_metrics=self.metrics.vllm,
            on_restart=self._restarted,
        )
        self.watch = EngineWatch(self.pool.engines, s.engine_stats_interval_s, self.metrics.vllm)
        self.admission = SchedulerAdmission(
            scheduler_config(s, self.pool, self.tenants),
            observer=SchedulerMetrics(self.metrics),
            models=self.pool,
        )
        self.pool.attach(self.admission)
        self.lifecycle = Lifecycle(self.verifier, self.pool.engines, self.metrics)
        store: TaskStore = (
            RedisTaskStore.from_url(s.redis_url) if s.redis_url else MemoryTaskStore(time.time)
        )
        roots = Roots(
            Path(s.model_base_path).expanduser(),
            Path(s.hf_home).expanduser() if s.hf_home else None,
            tuple(p.parent for m in self.models.models if (p := m.local_path()) is not None),
        )
        self.roots = roots
        self.loads = LoadManager(
            self.pool, self.lifecycle, store, roots, self.models.default_backend, s.runner_id
        )
        self.loads.on_finished = self.metrics.count_load
        self.pool.on_loaded = self.metrics.observe_load
        self.refresher = Refresher(
            self.pool,
            self.telemetry,
            catalog=lambda: available([slot.spec for slot in self.pool.slots.values()], roots),
        )
        self.metrics.registry.register(SnapshotCollector(lambda: self.refresher.current))
        self._jobs_init()

    def _restarted(self, spec: ModelSpec) -> None:
        if spec.backend == "faster-whisper":
            self.metrics.count_worker_restart(spec.id)

    def _engines_memory_mb(self) -> int:
        pids = self.pool.engine_pids()
        return tree_resident_mb(pids) if pids else 0

    # -- async jobs: `Prefer: respond-async` on the image and audio routes,
    # GET/DELETE /v1/jobs/{id}; webhooks signed with WEBHOOK_SECRET when it is set.

    def _jobs_init(self) -> None:
        s = self.settings
        self.job_store: JobStore = (
            RedisJobStore.from_url(s.redis_url, retention_s=s.job_retention_s)
            if s.redis_url
            else MemoryJobStore(time.time, retention_s=s.job_retention_s)
        )
        sender = None
        if s.webhook_secret is not None:  # validated at start-up (quorum serve: exit 2)
            self.webhook_client = httpx.AsyncClient(follow_redirects=False)
            sender = WebhookSender(self.webhook_client, s.webhook_secret.get_secret_value())
        self.jobs = JobManager(self.job_store, sender, s.runner_id, time.time)

    def request_tenant(self, request: Request) -> str:
        """The tenant of a job request, identified as for inference."""
        meta = parse_request_headers(list(request.scope["headers"]))
        if not self.settings.enable_multi_tenant:
            return DEFAULT_TENANT
        return resolve_tenant(meta.authorization, meta.tenant_header, self.tenants)


def _json(status: int, body: object, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status, headers=headers, media_type="application/json")


async def _bounded_body(request: Request, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is larger than {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


def control_plane(rt: Runtime) -> FastAPI:
    app = FastAPI(title="Quorum runner", docs_url=None, redoc_url=None, openapi_url=None)

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
    async def _framework_error(_: Request, exc: StarletteHTTPException) -> Response:
        # Unknown paths and wrong methods answer in the same envelope as everything else.
        error = RouteError(exc.status_code, str(exc.detail))
        return Response(
            error_body(error),
            error.status,
            headers=dict(exc.headers or {}),
            media_type="application/json",
        )

    @app.get("/health")
    async def get_health() -> Response:
        states = [slot.state for slot in rt.pool.slots.values()]
        report = health(
            rt.life,
            time.monotonic() - rt.started_at,
            states.count(ModelState.READY),
            states.count(ModelState.FAILED),
            rt.admission.queue_depth(),
            rt.settings.max_queue_depth,
            gpu_out_of_memory=rt.refresher.current.source == "nvml"
            and rt.refresher.current.out_of_memory(),
        )
        return _json(report.status_code, report.body)

    @app.get("/v1/capabilities")
    async def get_capabilities() -> Response:
        doc = capabilities(
            rt.settings.runner_id,
            rt.life,
            list(rt.pool.slots.values()),
            rt.admission.stats().capabilities(),
            rt.settings.enable_multi_tenant,
            rt.settings.vllm_enable_prefix_caching,
            loading=rt.loads.progress,
            available=rt.refresher.current.available,
            resources=rt.refresher.current,
            engines=rt.watch.loads,
            versions=rt.watch.versions,
        )
        status = 200 if rt.life is Life.READY else 503
        return _json(status, doc, {"Cache-Control": "max-age=5"})

    @app.get("/metrics")
    async def get_metrics() -> Response:
        if not rt.settings.enable_metrics:
            raise ServiceUnavailable("metrics are disabled (ENABLE_METRICS=false)")
        return Response(rt.metrics.render(), 200, media_type=rt.metrics.content_type)

    @app.post("/v1/cache/flush")
    async def cache_flush(request: Request) -> Response:
        body = await _bounded_body(request, rt.settings.max_body_bytes)
        return _json(200, await rt.lifecycle.flush(body, request.headers.get("x-op-token")))

    @app.post("/v1/models/load")
    async def load_model(request: Request) -> Response:
        body = await _bounded_body(request, rt.settings.max_body_bytes)
        task = await rt.loads.submit(body, request.headers.get("x-op-token"))
        return _json(202, task.accepted_json(), {"Location": f"/v1/models/load/{task.task_id}"})

    @app.get("/v1/models/load/{task_id}")
    async def load_status(task_id: str) -> Response:
        return _json(200, (await rt.loads.get(task_id)).to_json())

    @app.delete("/v1/models/load/{task_id}")
    async def load_cancel(task_id: str, request: Request) -> Response:
        body = await _bounded_body(request, rt.settings.max_body_bytes)
        task = await rt.loads.cancel(task_id, body, request.headers.get("x-op-token"))
        return _json(200, task.to_json())

    @app.post("/v1/models/unload")
    async def unload_model(request: Request) -> Response:
        body = await _bounded_body(request, rt.settings.max_body_bytes)
        result = await rt.loads.unload(body, request.headers.get("x-op-token"))
        answer: dict[str, object] = {
            "modelId": result.model_id,
            "gpuMemoryFreedMB": result.freed_mb,
            "kvCacheFlushed": result.kv_cache_flushed,
        }
        if result.mode != "stop":
            answer["mode"] = result.mode
        return _json(200, answer)

    @app.get(JOBS_PATH + "{job_id}")
    async def job_status(job_id: str, request: Request) -> Response:
        answer = await get_job(rt.jobs, job_id, rt.request_tenant(request))
        return _json(answer.status, answer.body, answer.headers)

    @app.delete(JOBS_PATH + "{job_id}")
    async def job_cancel(job_id: str, request: Request) -> Response:
        answer = await delete_job(rt.jobs, job_id, rt.request_tenant(request))
        return _json(answer.status, answer.body, answer.headers)

    @app.get("/v1/models")
    async def list_models() -> Response:
        data = [
            {"id": m.spec.id, "object": "model", "created": m.loaded_at, "owned_by": "quorum"}
            for m in rt.pool.slots.values()
            if m.state is ModelState.READY
        ]
        return _json(200, {"object": "list", "data": data})

    @app.get("/v1/models/{model_id:path}/logs")
    async def model_logs(model_id: str, request: Request) -> Response:
        admin_only(rt, request)
        lines = rt.pool.logs(model_id)
        return _json(200, {"modelId": model_id, "lines": lines})

    return app


def admin_only(rt: Runtime, request: Request) -> None:
    """Engine logs are for the tenants ADMIN_TENANTS names (identified as for inference)."""
    meta = parse_request_headers(list(request.scope["headers"]))
    tenant = resolve_tenant(meta.authorization, meta.tenant_header, rt.tenants)
    if tenant not in rt.settings.admins:
        raise Forbidden("engine logs are readable by ADMIN_TENANTS only")


class RunnerApp:
    """ASGI entry point: lifespan, inference fast path, control plane."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.control = control_plane(rt)
        self.data: DataPath | None = None
        self.audio: AudioPath | None = None
        self.images: ImagesPath | None = None
        self.image_files: ImageFiles | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            if path == IMAGES_PATH or path.startswith(FILES_PATH):
                await self._images(scope, receive, send)
            elif path in INFERENCE_PATHS:
                await self._post_only(self.data, scope, receive, send)
            elif path in AUDIO_PATHS:
                await self._post_only(self.audio, scope, receive, send)
            else:
                await self.control(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        else:
            await self.control(scope, receive, send)

    async def _post_only(
        self, handler: DataPath | AudioPath | None, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """A bare request path: POST only, and only while the runner is ready."""
        if scope["method"] != "POST":
            error: RunnerError = RouteError(405, f"{scope['path']} accepts POST only")
            error.headers["Allow"] = "POST"
            await send_error(send, error, new_request_id())
        elif handler is not None and self.rt.life is Life.READY:
            await handler(scope, receive, send)
        else:
            error = ServiceUnavailable(f"runner is {self.rt.life.value}; retry on another runner")
            await send_error(send, error, new_request_id())

    async def _images(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The image routes: bare ASGI like the data path (adapters/comfyui/http.py)."""
        files = scope["path"].startswith(FILES_PATH)
        handler = self.image_files if files else self.images
        if self.rt.life is not Life.READY or (handler is None and not files):
            error: RunnerError = ServiceUnavailable(
                f"runner is {self.rt.life.value}; retry on another runner"
            )
            await send_error(send, error, new_request_id())
        elif handler is None:
            await send_error(send, RouteError(404, "no image is kept here"), new_request_id())
        else:
            await handler(scope, receive, send)

    def _start_images(self) -> None:
        rt, s = self.rt, self.rt.settings
        assert rt.limiter is not None
        routes = image_routes(
            rt.pool,
            rt.admission,
            rt.limiter,
            rt.tenants,
            rt.metrics,
            s,
            job_submitter(rt.jobs),
            keep_files=any(m.backend == "comfyui" for m in rt.models.models),
        )
        self.images, self.image_files = routes.images, routes.files
        if routes.store is not None:
            self._sweeper = asyncio.get_running_loop().create_task(sweep_forever(routes.store))

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    log.exception("start-up failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def startup(self) -> None:
        rt = self.rt
        s = rt.settings
        await rt.admission.start()
        await rt.loads.start()
        await rt.jobs.start()
        await rt.pool.start()
        await rt.refresher.start()
        await rt.watch.start()
        store_errors = rt.metrics.ratelimit_store_errors
        rt.limiter = RateLimiter(
            rt.tenants,
            storage_from_url(s.redis_url),
            fail_open=s.rate_limit_fail_open,
            on_storage_error=lambda _tenant, _exc: store_errors.inc(),
        )
        rt.metrics.watch_queue(lambda: rt.admission.stats().depth_by_priority)
        if s.enable_metrics and s.metrics_port and s.metrics_port != s.port:
            rt.metrics.serve_separately(s.metrics_port, s.host)
        self.data = DataPath(
            rt.pool.engines,
            rt.admission,
            rt.limiter,
            rt.tenants,
            rt.metrics,
            s.max_body_bytes,
            multi_tenant=s.enable_multi_tenant,
            route_missing=rt.pool.route_missing_for(speech=False),
        )
        self.audio = AudioPath(
            rt.pool.speech,
            rt.admission,
            rt.limiter,
            rt.tenants,
            rt.metrics,
            FormLimits(max_file_bytes=s.audio_max_bytes),
            multi_tenant=s.enable_multi_tenant,
            route_missing=rt.pool.route_missing_for(speech=True),
            submit_job=job_submitter(rt.jobs),
        )
        self._start_images()
        gc.collect()
        gc.freeze()  # start-up objects never need scanning again: shorter GC pauses later
        rt.life = Life.READY
        log.info("runner %s ready with %d model(s)", s.runner_id, len(rt.pool.engines))

    def begin_shutdown(self) -> None:
        """Called when SIGTERM arrives: /health turns 503 at once, new inference is refused."""
        self.rt.life = Life.STOPPING

    async def shutdown(self) -> None:
        self.rt.life = Life.STOPPING
        await self.rt.loads.aclose()
        await self.rt.jobs.aclose()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        await self.rt.refresher.stop()
        await self.rt.watch.stop()
        await self.rt.admission.stop()
        if self.rt.limiter is not None:
            await self.rt.limiter.aclose()
        if self.rt.verifier is not None:
            await self.rt.verifier.aclose()
        await self.rt.pool.close()
        await self.rt.loads.store.aclose()
        await self.rt.pool.leases.aclose()
        await self.rt.job_store.aclose()
        if self.rt.webhook_client is not None:
            await self.rt.webhook_client.aclose()


def build_app(
    settings: Settings,
    models: ModelsFile,
    tenants: TenantsConfig | None = None,
    verifier: Verifier | None = None,
) -> RunnerApp:
    return RunnerApp(
        Runtime(
            settings=settings, models=models, tenants=tenants or TenantsConfig(), verifier=verifier
        )
    )
