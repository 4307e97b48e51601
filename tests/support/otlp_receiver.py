"""A small OTLP receiver for the tests: what an OpenTelemetry collector would get.

`OtlpReceiver` listens on loopback for OTLP/HTTP (`POST /v1/traces`, protobuf, decoded
with `opentelemetry-proto`), and, with `grpc=True`, for OTLP/gRPC on a port of its own
(the collector's `TraceService/Export`). Every other POST is kept as a webhook delivery
(its headers), so one receiver also stands in for a tenant's webhook endpoint. Spans are
kept as plain `Received` records; `wait_for` polls them until a condition holds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

_KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass(frozen=True)
class Received:
    """One span as the receiver decoded it (ids in lower-case hex)."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: str
    service: str
    attributes: dict[str, Any]
    events: tuple[str, ...]
    error: bool  # its status is ERROR
    event_attributes: tuple[dict[str, Any], ...] = ()  # each event's, in `events`' order

    def event(self, name: str) -> dict[str, Any] | None:
        """The attributes of the first event named `name` (None: no such event)."""
        found = [a for n, a in zip(self.events, self.event_attributes, strict=True) if n == name]
        return found[0] if found else None


@dataclass
class OtlpReceiver:
    port: int = 0
    grpc_port: int = 0
    spans: list[Received] = field(default_factory=list)
    hooks: list[dict[str, str]] = field(default_factory=list)  # each POST's headers
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def take(self, body: bytes) -> None:
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        decoded = list(_decode(request))
        with self._lock:
            self.spans.extend(decoded)

    def in_trace(self, trace_id: str) -> list[Received]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(
        self, check: Callable[[OtlpReceiver], Any], timeout: float = 20.0, what: str = ""
    ) -> Any:
        """Poll `check(self)` until it returns something true (returned) or time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            found = check(self)
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"never received {what or 'the spans'}: {self.spans}")
            time.sleep(0.05)


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    return getattr(v, which) if which else None


def _decode(request: Any) -> Iterator[Received]:
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        service = str(resource.get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield Received(
                    name=span.name,
                    trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(),
                    parent_id=span.parent_span_id.hex(),
                    kind=_KINDS.get(span.kind, "unspecified"),
                    service=service,
                    attributes={a.key: _value(a.value) for a in span.attributes},
                    events=tuple(e.name for e in span.events),
                    error=span.status.code == 2,
                    event_attributes=tuple(
                        {a.key: _value(a.value) for a in e.attributes} for e in span.events
                    ),
                )


def _handler(receiver: OtlpReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.path == "/v1/traces":
                receiver.take(body)
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
            else:
                with receiver._lock:
                    receiver.hooks.append({k.lower(): v for k, v in self.headers.items()})
                answer = b""
                self.send_response(204)
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler


@contextmanager
def otlp_receiver(grpc: bool = False) -> Iterator[OtlpReceiver]:
    """A receiver listening on loopback for the block (OTLP/HTTP; OTLP/gRPC too if asked)."""
    receiver = OtlpReceiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    grpc_server = _grpc_server(receiver) if grpc else None
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
        if grpc_server is not None:
            grpc_server.stop(None).wait(10)


def _grpc_server(receiver: OtlpReceiver) -> Any:
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    class Service(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
        def Export(self, request: Any, context: Any) -> Any:
            receiver.take(request.SerializeToString())
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    receiver.grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server
