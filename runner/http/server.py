"""Serving the runner with uvicorn, with a graceful SIGTERM.

On SIGTERM or SIGINT: /health turns 503 and new inference is refused at once;
uvicorn stops accepting connections and waits (at most SHUTDOWN_GRACE_S) for
in-flight requests, streams included, to finish; then the process exits 0.
uvicorn's own handler would re-raise the signal after shutdown (exit status
-15); a clean, finished shutdown is not a failure, so we exit 0.

Connections are served by `GuardedHttpToolsProtocol` (runner/http/limits.py): coalesced
writes, and the client limits of the settings (`client_limits`), with the share of
connections kept for clients the identity recognises (`_proof`).
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
from collections.abc import Generator
from types import FrameType

import prometheus_client
import uvicorn

from runner.floor.settings import Settings
from runner.http.app import RunnerApp
from runner.http.audio.handler import AUDIO_PATHS
from runner.http.chat import CHAT_PATHS
from runner.http.hosts import allowed_hosts
from runner.http.images.handler import IMAGES_PATH
from runner.http.limits import ClientLimits, protocol_with
from runner.http.reserve import Prove
from runner.http.traced import TracedApp
from runner.telemetry import tracing
from tenants.identity import parse_peers

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
BARE_ROUTES = CHAT_PATHS | AUDIO_PATHS | {IMAGES_PATH}  # their own routes, on a server span


class RunnerServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: RunnerApp) -> None:
        super().__init__(config)
        self.runner_app = app

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.runner_app.begin_shutdown()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def client_limits(settings: Settings) -> ClientLimits:
    """What one client may cost (runner/http/limits.py), from the settings."""
    return ClientLimits(
        max_header_bytes=settings.max_header_bytes,
        max_headers=settings.max_headers,
        header_timeout_s=settings.header_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        max_connections=settings.max_connections,
        write_stall_timeout_s=settings.write_stall_timeout_s,
        keep_alive_s=settings.keep_alive_timeout_s,
        max_per_source=settings.max_connections_per_source,
        reserved=int(settings.max_connections * settings.authenticated_connection_share),
        hosts=allowed_hosts(settings.allowed_hosts, settings.host),
        trusted=parse_peers(settings.gateway_peers),
    )


def _proof(app: RunnerApp) -> Prove | None:
    """What proves who a connection's client is, for the connections kept for
    authenticated clients (runner/http/reserve.py): the data path's identity, unless
    nothing can prove anything (open mode)."""
    return app.rt.identify if app.rt.identity.proves else None


def serve(
    app: RunnerApp, host: str, port: int, grace_s: float, limits: ClientLimits | None = None
) -> bool:
    """Run until a signal; True when start-up succeeded."""
    # No `*_created` series on /metrics: the classic text format has no place for them
    # (prometheus_client writes them as extra gauges), and they were ~13% of a scrape.
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    limits = limits or ClientLimits()
    config = uvicorn.Config(
        TracedApp(app, BARE_ROUTES) if tracing.on() else app,
        host=host,
        port=port,
        loop="uvloop",
        http=protocol_with(limits, app.rt.metrics.count_write_stall, _proof(app)),
        lifespan="on",
        access_log=False,
        proxy_headers=False,
        server_header=False,
        log_config=None,
        timeout_graceful_shutdown=math.ceil(grace_s),
        timeout_keep_alive=math.ceil(limits.keep_alive_s),  # the sweep closes idle ones
    )
    server = RunnerServer(config, app)
    server.run()
    return server.started
