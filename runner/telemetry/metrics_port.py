"""METRICS_PORT: the runner's metrics paths on a port of their own, served by a thread.

prometheus_client's WSGI app writes one collector at every path; here each metrics path
(`/metrics`, and the endpoint picker's PICKER_METRICS_PATH) gets its own app, and any other
path the `/metrics` one, as prometheus_client's own `start_http_server` answers. The apps
collect at each scrape on this server's threads (not the text cached for the main port),
and negotiate the format and compression as prometheus_client does.

A thread per connection, as prometheus_client's server has, but bounded: at most
`MAX_SCRAPES` connections are served at once (one more is closed at once, unread), and a
connection's socket gives up after `TIMEOUT_S` without a byte either way. So a thousand
half-sent requests hold `MAX_SCRAPES` threads for `TIMEOUT_S`, not a thousand for ever.
"""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
MAX_SCRAPES = 8
"""Connections served at once (Prometheus scrapes each target with one)."""
TIMEOUT_S = 10.0
"""A connection's longest silence, reading the request or writing the answer."""


class _Quiet(WSGIRequestHandler):
    """No access log line per scrape; a socket timeout (`StreamRequestHandler.timeout`)."""

    timeout = TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        return None


def path_app(paths: Mapping[str, Collector], default: str) -> WsgiApp:
    """A WSGI app that writes `paths[path]`, or `paths[default]` for any other path."""
    apps = {path: make_wsgi_app(collector) for path, collector in paths.items()}
    fallback = apps[default]

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        chosen: WsgiApp = apps.get(environ.get("PATH_INFO", ""), fallback)
        return chosen(environ, start_response)

    return app


def serve_paths(port: int, host: str, paths: Mapping[str, Collector], default: str) -> None:
    """Serve `path_app(paths, default)` on `host:port` from a daemon thread."""

    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = infos[0]  # IPv4 or IPv6, as prometheus_client chooses

    class Server(BoundedServer):
        address_family = family

    app = path_app(paths, default)
    httpd = make_server(str(address[0]), port, app, Server, handler_class=_Quiet)
    threading.Thread(target=httpd.serve_forever, name="metrics-port", daemon=True).start()


class BoundedServer(ThreadingWSGIServer):
    """prometheus_client's threading server, serving at most MAX_SCRAPES connections at
    once: one more is closed at once, before any thread is started for it."""

    slots = MAX_SCRAPES

    def server_activate(self) -> None:
        super().server_activate()
        self._free = threading.BoundedSemaphore(self.slots)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._free.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._free.release()
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went silent (TIMEOUT_S) or away is no error of the runner's."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._free.release()
