"""The runner as one ASGI application.

Inference paths go straight to the bare chat path (runner/http/chat.py), the audio
paths to the bare audio path (runner/audio/handler.py), the image paths to the
image handler (runner/images/handler.py), all three through the one front-end
(runner/http/frontend.py); the control plane (runner/http/control_plane.py: health, metrics,
capabilities, model list, lifecycle, jobs) is a FastAPI app, where a little framework
cost does not matter. What the runner holds while it lives is built in
runner/runtime/wiring.py. The runner handles the ASGI lifespan itself: start-up starts the
scheduler, the rate limiter, the job manager and the request paths, and completes at
once, so uvicorn listens from the first second; the engines are attached and the
`preload` models loaded in the background meanwhile (`/health` 503 `starting`,
capabilities 503 with `Retry-After`), and the runner turns ready when they are done.
Shutdown stops them after uvicorn has drained in-flight requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math

from adapters.comfyui import FILES_PATH, ImageStore
from governance.verifier import Verifier
from runner.audio.handler import AUDIO_PATHS, AudioPath
from runner.audio.multipart import FormLimits
from runner.engines.kinds import EngineKinds
from runner.errors import MethodNotAllowed, RouteNotFound
from runner.http.asgi import Receive, Scope, Send, send_error, send_whole
from runner.http.chat import CHAT_PATHS, ChatPath
from runner.http.control_plane import control_plane
from runner.http.frontend import FrontEnd
from runner.http.headers import new_request_id
from runner.images.handler import IMAGES_PATH, ImageFiles, ImagesPath
from runner.images.routes import image_routes, sweep_forever
from runner.jobs.http import job_submitter
from runner.runtime.models_file import ModelsFile
from runner.runtime.settings import Settings
from runner.runtime.wiring import Runtime
from runner.telemetry.exposition import Exposition
from runner.telemetry.forecast_metrics import ForecastGauges
from runner.telemetry.health import Life
from tenants.config import TenantsConfig
from tenants.ratelimit import RateLimiter
from tenants.storage import storage_from_url

log = logging.getLogger("quorum.app")

REFUSE_WAITERS_BEFORE_S = 0.5
"""How long before uvicorn's graceful-shutdown timeout the queued requests are refused:
time for their 503s to be written before uvicorn cancels what is left."""


class RunnerApp:
    """ASGI entry point: lifespan, inference fast path, control plane."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.control = control_plane(rt)
        self.chat: ChatPath | None = None
        self.audio: AudioPath | None = None
        self.images: ImagesPath | None = None
        self.image_files: ImageFiles | None = None
        self.image_store: ImageStore | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._preloading: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._refusal_set = False
        self._refusing: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            if path == IMAGES_PATH or path.startswith(FILES_PATH):
                await self._images(scope, receive, send)
            elif path in CHAT_PATHS:
                await self._post_only(self.chat, scope, receive, send)
            elif path in AUDIO_PATHS:
                await self._post_only(self.audio, scope, receive, send)
            elif (
                (exposition := self.rt.metrics.paths.get(path)) is not None
                and scope["method"] == "GET"
                and self.rt.settings.enable_metrics
            ):
                await self._metrics(send, exposition)
            else:
                await self.control(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        else:
            await self.control(scope, receive, send)

    async def _metrics(self, send: Send, exposition: Exposition) -> None:
        """`GET /metrics` and the picker's `GET /metrics/picker` (PICKER_METRICS_PATH), bare
        like the data path: the endpoint picker reads its path 20 times a second
        (docs/benchmarks.md); ENABLE_METRICS=false and other methods are the control
        plane's. Not gzipped: compressing its ~13 KB cost the runner more CPU (~+100 us)
        than writing them."""
        headers = [(b"content-type", self.rt.metrics.content_type.encode())]
        await send_whole(send, 200, headers, exposition.render())

    async def _post_only(
        self, handler: ChatPath | AudioPath | None, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """A bare request path: POST only, and only while the runner is ready."""
        if scope["method"] != "POST":
            error = MethodNotAllowed(path=scope["path"], allow="POST")
            await send_error(send, error, new_request_id())
        elif handler is not None and self.rt.life is Life.READY:
            await handler(scope, receive, send)
        else:
            await send_error(send, self.rt.unavailable(), new_request_id())

    async def _images(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The image routes: bare ASGI like the data path (runner/images/handler.py)."""
        files = scope["path"].startswith(FILES_PATH)
        handler = self.image_files if files else self.images
        if self.rt.life is not Life.READY or (handler is None and not files):
            await send_error(send, self.rt.unavailable(), new_request_id())
        elif handler is None:
            await send_error(send, RouteNotFound("no image is kept here"), new_request_id())
        else:
            await handler(scope, receive, send)

    def _start_images(self, front: FrontEnd) -> None:
        rt = self.rt
        routes = image_routes(
            front,
            rt.pool,
            rt.settings,
            job_submitter(rt.jobs),
            keep_files=any(
                rt.specs.kind(m).traits.request_path == "images" for m in rt.models.models
            ),
            count_images=rt.count_images,
        )
        self.images, self.image_files = routes.images, routes.files
        self.image_store = routes.store
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
        self._loop = asyncio.get_running_loop()
        rt = self.rt
        s = rt.settings
        await rt.admission.start()
        await rt.loads.start()
        await rt.jobs.start()
        await rt.refresher.start()
        await rt.watch.start()
        store_errors = rt.metrics.ratelimit_store_errors
        rt.limiter = RateLimiter(
            rt.tenants,
            storage_from_url(s.redis_url, timeout_s=s.rate_limit_store_timeout_ms / 1000),
            fail_open=s.rate_limit_fail_open,
            on_storage_error=lambda _tenant, _exc: store_errors.inc(),
        )
        rt.metrics.watch_queue(rt.admission.depth_by_priority)
        rt.metrics.registry.register(ForecastGauges(rt.admission.stats))
        if s.enable_metrics and s.metrics_port and s.metrics_port != s.port:
            rt.metrics.serve_separately(s.metrics_port, s.host)
        front = rt.front = rt.front_end(rt.limiter)
        await rt.tenancy.start(rt.apply_tenants, rt.admission.permit_granted)
        records = rt.pool.records
        self.chat = ChatPath(
            front, rt.pool.ready.chat, rt.metrics, s.max_body_bytes,
            context_of=lambda m: r.context_length if (r := records.get(m)) else None,
        )  # fmt: skip
        self.audio = AudioPath(
            front,
            rt.pool.ready.speech,
            rt.metrics,
            FormLimits(max_file_bytes=s.audio_max_bytes),
            submit_job=job_submitter(rt.jobs),
        )
        self._start_images(front)
        # Listen first: uvicorn binds once this returns, so /health and capabilities answer
        # 503 "starting" (Retry-After: the preloads' eta) while the models preload.
        self._preloading = asyncio.get_running_loop().create_task(self._preload())

    async def _preload(self) -> None:
        """Preload, then turn READY (unless a SIGTERM came first: it stays STOPPING). A
        model that fails to preload reads failed, as before; an unexpected error is
        logged and the runner still turns ready, its models as the scheduler has them."""
        rt = self.rt
        try:
            await rt.preload()
        except Exception:
            log.exception("preload failed unexpectedly")
        gc.collect()
        gc.freeze()  # start-up objects never need scanning again: shorter GC pauses later
        if rt.life is Life.STARTING:
            rt.life = Life.READY
            ready = len(rt.pool.ready)
            log.info("runner %s ready with %d model(s)", rt.settings.runner_id, ready)

    def begin_shutdown(self) -> None:
        """Called when SIGTERM arrives: /health turns 503 at once, new inference is refused.

        Requests still queued just before uvicorn's grace (SHUTDOWN_GRACE_S) runs out are
        refused then by the scheduler (503 `shutting_down`, `Retry-After`): uvicorn cancels
        whatever is left at its end, and a request cancelled before it answered would
        get uvicorn's bare 500. Runs in the signal handler, so the timer is set through
        `call_soon_threadsafe`."""
        self.rt.life = Life.STOPPING
        loop = self._loop
        if loop is None or self._refusal_set:
            return
        self._refusal_set = True
        grace = math.ceil(self.rt.settings.shutdown_grace_s)  # uvicorn's timeout
        delay = max(0.0, grace - REFUSE_WAITERS_BEFORE_S)
        loop.call_soon_threadsafe(loop.call_later, delay, self._refuse_waiters)

    def _refuse_waiters(self) -> None:
        self._refusing = asyncio.get_running_loop().create_task(self.rt.admission.stop())

    async def shutdown(self) -> None:
        self.rt.life = Life.STOPPING
        if self._preloading is not None:  # SIGTERM while preloading: the pool stops engines
            self._preloading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._preloading
        await self.rt.loads.aclose()
        await self.rt.jobs.aclose()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self.image_store is not None:  # URLs die with the runner: so do their files
            removed = await asyncio.to_thread(self.image_store.close)
            log.info("image store closed: %d image(s) removed", removed)
        await self.rt.refresher.stop()
        await self.rt.watch.stop()
        await self.rt.admission.stop()
        if self.rt.limiter is not None:
            await self.rt.limiter.aclose()
        if self.rt.verifier is not None:
            await self.rt.verifier.aclose()
        await self.rt.pool.close()
        await self.rt.loads.store.aclose()
        await self.rt.pool.gpus.leases.aclose()
        await self.rt.job_store.aclose()
        await self.rt.tenancy.aclose()
        if self.rt.webhook_client is not None:
            await self.rt.webhook_client.aclose()


def build_app(
    settings: Settings,
    models: ModelsFile,
    tenants: TenantsConfig | None = None,
    verifier: Verifier | None = None,
    kinds: EngineKinds | None = None,
) -> RunnerApp:
    """The runner for `settings` and `models`; `kinds` the engine kinds the models file
    was checked against (default: those the settings name)."""
    return RunnerApp(
        Runtime(
            settings=settings,
            models=models,
            tenants=tenants or TenantsConfig(),
            verifier=verifier,
            kinds=kinds,
        )
    )
