"""The runner as one ASGI application.

Inference paths go straight to the bare data path (runner/proxy.py); the
control plane (health, metrics, model list, and later lifecycle) is a FastAPI
app, where a little framework cost does not matter. The runner handles the
ASGI lifespan itself: start-up attaches engines and opens the engine client;
shutdown closes them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from adapters.base import Engine
from adapters.openai import AttachedOpenAIEngine
from runner.admission import Admission, OpenAdmission
from runner.errors import (
    RunnerError,
    ServiceUnavailable,
    error_body,
    error_headers,
    error_status,
)
from runner.headers import new_request_id
from runner.health import Life, health
from runner.metrics import Metrics
from runner.models_config import ModelsFile
from runner.proxy import INFERENCE_PATHS, DataPath, Receive, Scope, Send, send_error
from runner.settings import Settings
from runner.upstream import Pool

log = logging.getLogger("quorum.app")


@dataclass
class Runtime:
    """Everything the runner holds while it lives; built once, read by handlers."""

    settings: Settings
    models: ModelsFile
    metrics: Metrics = field(default_factory=Metrics)
    admission: Admission = field(default_factory=OpenAdmission)
    engines: dict[str, Engine] = field(default_factory=dict)
    life: Life = Life.STARTING
    started_at: float = field(default_factory=time.monotonic)


def _json(status: int, body: object, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status, headers=headers, media_type="application/json")


def control_plane(rt: Runtime) -> FastAPI:
    app = FastAPI(title="Quorum runner", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RunnerError)
    async def _runner_error(_: Request, exc: RunnerError) -> Response:
        return Response(
            error_body(exc),
            error_status(exc),
            headers=error_headers(exc),
            media_type="application/json",
        )

    @app.get("/health")
    async def get_health() -> Response:
        report = health(
            rt.life,
            time.monotonic() - rt.started_at,
            len(rt.engines),
            0,
            rt.admission.queue_depth(),
        )
        return _json(report.status_code, report.body)

    @app.get("/metrics")
    async def get_metrics() -> Response:
        if not rt.settings.enable_metrics:
            return _json(
                404,
                {
                    "error": {
                        "code": "metrics_disabled",
                        "type": "not_found_error",
                        "message": "metrics are disabled (ENABLE_METRICS)",
                    }
                },
            )
        return Response(rt.metrics.render(), 200, media_type=rt.metrics.content_type)

    @app.get("/v1/models")
    async def list_models() -> Response:
        now = int(time.time())
        data = [
            {"id": m, "object": "model", "created": now, "owned_by": "quorum"}
            for m in sorted(rt.engines)
        ]
        return _json(200, {"object": "list", "data": data})

    return app


class RunnerApp:
    """ASGI entry point: lifespan, inference fast path, control plane."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.control = control_plane(rt)
        self.data: DataPath | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if scope["path"] in INFERENCE_PATHS and scope["method"] == "POST":
                data = self.data
                if data is not None and self.rt.life is Life.READY:
                    await data(scope, receive, send)
                else:
                    await send_error(
                        send,
                        ServiceUnavailable(
                            f"runner is {self.rt.life.value}; retry on another runner"
                        ),
                        new_request_id(),
                    )
                return
            await self.control(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        else:
            await self.control(scope, receive, send)

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
        for spec in rt.models.models:
            assert spec.url is not None  # only URL-attached backends exist so far
            rt.engines[spec.id] = AttachedOpenAIEngine(spec.id, spec.url, spec.slots)
        pools = {
            m: Pool(e.base_url, s.engine_connect_timeout_s, s.engine_read_timeout_s)
            for m, e in rt.engines.items()
        }
        self.data = DataPath(rt.engines, pools, rt.admission, rt.metrics, s.max_body_bytes)
        rt.life = Life.READY
        log.info("runner %s ready with %d model(s)", s.runner_id, len(rt.engines))

    def begin_shutdown(self) -> None:
        """Called when SIGTERM arrives: /health turns 503 at once, new inference is refused."""
        self.rt.life = Life.STOPPING

    async def shutdown(self) -> None:
        self.rt.life = Life.STOPPING
        if self.data is not None:
            for pool in self.data.pools.values():
                pool.close()


def build_app(settings: Settings, models: ModelsFile, **overrides: Any) -> RunnerApp:
    return RunnerApp(Runtime(settings=settings, models=models, **overrides))
