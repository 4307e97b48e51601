"""The runner as one ASGI application.

Inference paths go straight to the bare request paths, peers: the chat path
(runner/http/chat.py), the audio path (runner/http/audio/handler.py), the image path
(runner/http/images/handler.py), all three through the one front-end
(runner/http/frontend.py), each mounted when an engine kind of the runner declares it
(`Traits.request_path`, `request_routes`); the control plane
(runner/http/control_plane.py: health, metrics, capabilities, model list, lifecycle, jobs)
is a FastAPI app, where a little framework cost does not matter. What the runner holds
while it lives, the request paths included, is built once in runner/runtime/wiring.py (the
paths: runtime/paths.py). The runner handles the ASGI lifespan itself: start-up starts
what the runtime holds (`Runtime.start`, each stop pushed on one `AsyncExitStack`) and
completes at once, so uvicorn listens from the first second; the engines are attached and
the `preload` models loaded in the background meanwhile (`/health` 503 `starting`,
capabilities 503 with `Retry-After`), and the runner turns ready when they are done.
Shutdown, after uvicorn has drained in-flight requests, closes the stack: everything stops
in the reverse order it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import math
from collections.abc import Collection, Iterable, Mapping

from adapters.image_store import FILES_PATH
from runner.errors import MethodNotAllowed, RouteNotFound
from runner.floor.periodic import cancelled
from runner.http.asgi import ASGIApp, Receive, Scope, Send, send_error, send_whole
from runner.http.audio.handler import AUDIO_PATHS
from runner.http.chat import CHAT_PATHS
from runner.http.control_plane import control_plane
from runner.http.headers import new_request_id
from runner.http.images.handler import IMAGES_PATH
from runner.http.runner_view import RunnerView
from runner.telemetry import tracing
from runner.telemetry.exposition import OPENMETRICS, OPENMETRICS_TYPE, Exposition
from runner.telemetry.health import Life

log = logging.getLogger("quorum.app")

GC_YOUNG_THRESHOLD = 10_000
"""Net allocations the cyclic GC lets its young generation grow by before it collects
it (Python's default: 700). 64 requests in flight hold ~2,000 young objects, so at 700
a young collection ran every ~40 requests and scanned, then promoted, the live requests'
objects each time: 15-20 us of CPU per request, ~6% of the runner's. Above the requests'
own population a young collection runs every few seconds (docs/benchmarks.md, issue 24)."""

REFUSE_WAITERS_BEFORE_S = 0.5
"""How long before uvicorn's graceful-shutdown timeout the queued requests are refused:
time for their 503s to be written before uvicorn cancels what is left."""


class RunnerApp:
    """ASGI entry point: lifespan, inference fast path, control plane."""

    def __init__(self, rt: RunnerView) -> None:
        self.rt = rt
        self.metric_paths = rt.api_metric_paths()
        self.routes = request_routes(
            {
                "chat": (CHAT_PATHS, functools.partial(self._post_only, rt.chat)),
                "audio": (AUDIO_PATHS, functools.partial(self._post_only, rt.audio)),
                "images": ((IMAGES_PATH,), self._images),
            },
            {kind.traits.request_path for kind in rt.kinds},
        )
        self.control = control_plane(rt)
        self._stack = contextlib.AsyncExitStack()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._refusal_set = False
        self._refusing: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            if (route := self.routes.get(path)) is not None:
                await route(scope, receive, send)
            elif path.startswith(FILES_PATH):
                await self._image_files(scope, receive, send)
            elif (
                (exposition := self.metric_paths.get(path)) is not None
                and scope["method"] == "GET"
                and self.rt.settings.enable_metrics
            ):
                await self._metrics(scope, send, exposition)
            else:
                await self.control(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        else:
            await self.control(scope, receive, send)

    async def _metrics(self, scope: Scope, send: Send, exposition: Exposition) -> None:
        """`GET /metrics` and the picker's `GET /metrics/picker` (PICKER_METRICS_PATH), bare
        like the data path: the endpoint picker reads its path 20 times a second
        (docs/benchmarks.md); ENABLE_METRICS=false and other methods are the control
        plane's. Not gzipped: compressing its ~13 KB cost the runner more CPU (~+100 us)
        than writing them. With tracing on, OpenMetrics when the scraper's `Accept` asks
        for it (the request-duration histogram's exemplars are in no other format), else
        the classic text: off, every scrape gets the classic text's cheap writer."""
        for name, value in scope["headers"] if tracing.on() else ():
            if name == b"accept" and OPENMETRICS in value:
                headers = [(b"content-type", OPENMETRICS_TYPE)]
                await send_whole(send, 200, headers, exposition.render_openmetrics())
                return
        headers = [(b"content-type", self.rt.metrics.content_type.encode())]
        await send_whole(send, 200, headers, exposition.render())

    async def _post_only(
        self, handler: ASGIApp, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """A bare request path: POST only, and only while the runner is ready."""
        if scope["method"] != "POST":
            error = MethodNotAllowed(path=scope["path"], allow="POST")
            await send_error(send, error, new_request_id())
        elif self.rt.life is Life.READY:
            await handler(scope, receive, send)
        else:
            await send_error(send, self.rt.unavailable(), new_request_id())

    async def _images(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The image path, bare like the data path (runner/http/images/handler.py): only
        while the runner is ready, POST only."""
        if self.rt.life is not Life.READY:
            await send_error(send, self.rt.unavailable(), new_request_id())
        elif scope["method"] != "POST":
            error = MethodNotAllowed(path=IMAGES_PATH, allow="POST")
            await send_error(send, error, new_request_id())
        else:
            await self.rt.images.images(scope, receive, send)

    async def _image_files(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The images kept for URLs (`ImageFiles`): only while the runner is ready."""
        files = self.rt.images.files
        if self.rt.life is not Life.READY:
            await send_error(send, self.rt.unavailable(), new_request_id())
        elif files is None:
            await send_error(send, RouteNotFound("no image is kept here"), new_request_id())
        else:
            await files(scope, receive, send)

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
        """Start what the runtime holds, then preload in the background. Listen first:
        uvicorn binds once this returns, so /health and capabilities answer 503
        "starting" (Retry-After: the preloads' eta) while the models preload."""
        self._loop = asyncio.get_running_loop()
        await self.rt.start(self._stack)
        preloading = self._loop.create_task(self._preload())
        self._stack.push_async_callback(cancelled, preloading)  # SIGTERM while preloading

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
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
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
        """Stop everything, in the reverse order it started (`Runtime.start`)."""
        self.rt.life = Life.STOPPING
        await self._stack.aclose()


def request_routes(
    paths: Mapping[str, tuple[Iterable[str], ASGIApp]], declared: Collection[str]
) -> dict[str, ASGIApp]:
    """The bare request paths by URL: each request path (`chat`, `audio`, `images`: its
    URLs, its handler) that some engine kind of the runner declares (`Traits.request_path`);
    the URLs of a path no kind declares are left to the control plane (404)."""
    return {url: app for name, (urls, app) in paths.items() if name in declared for url in urls}
