"""METRICS_PORT: the runner's metrics paths on a port of their own, served by a thread.

prometheus_client's WSGI app writes one collector at every path; here each metrics path
(`/metrics`, and the endpoint picker's PICKER_METRICS_PATH) gets its own app, and any other
path the `/metrics` one, as prometheus_client's own `start_http_server` answers. The apps
collect at each scrape on this server's threads (not the text cached for the main port),
and negotiate the format and compression as prometheus_client does.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _Quiet(WSGIRequestHandler):
    """No access log line per scrape."""

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

    class Server(ThreadingWSGIServer):
        address_family = family

    app = path_app(paths, default)
    httpd = make_server(str(address[0]), port, app, Server, handler_class=_Quiet)
    threading.Thread(target=httpd.serve_forever, name="metrics-port", daemon=True).start()
