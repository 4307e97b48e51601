"""The runner's spans at the HTTP layer: the server span of each request, the engine call.

Only in use when tracing is on (runner/telemetry/tracing.py): `quorum serve` wraps the
app in `TracedApp` then, and the chat path reads `tracing.ON` before it calls
`engine_call`, so tracing off costs the hot path two flag reads.

- **The server span** (`TracedApp`): every POST and DELETE, and a GET that carries a
  `traceparent` (health checks, scrapes and polls do not start traces of their own); it
  continues the caller's trace (`traceparent`/`tracestate`) or starts one. Named
  `{method} {route}` with `http.request.method`, `http.route`, `url.path`,
  `http.response.status_code`; an error answer's `error.type` is the runner's error code
  from its envelope (`token_budget_exceeded`, `model_not_allowed`, ...). The front-end
  adds the tenant and the model (`runner/telemetry/traced_requests.py`).
- **The engine call** (`engine_call`, when `tracing.ON`): a client span around the exchange,
  whose context the engine receives in `traceparent`: `gen_ai.operation.name`,
  `gen_ai.request.model`, `gen_ai.usage.input_tokens`/`output_tokens` (the engine's own
  figures), the time to the first streamed byte (`gen_ai.server.time_to_first_token`,
  seconds), the cache report; never the prompt or the answer.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import orjson
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from adapters.base import ChatEngine
from runner.http.asgi import ASGIApp, Message, Receive, Scope, Send
from runner.http.call import ClientCall
from runner.telemetry import tracing

_OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
}
FRAMEWORK_TELEMETRY_OFF: dict[str, object] = {}
"""FastAPI's own OpenTelemetry (0.165 and later), off for the control plane: with tracing
on it would add a second server span per request beside `TracedApp`'s, and log records of
failures with their messages (a request's values among them); the runner's spans say what
it decided. The keyword arguments for `FastAPI(...)`: none on an older FastAPI, which has
no telemetry of its own (vLLM 0.32.0, in the GPU image beside the runner, needs one below
0.137)."""
try:
    from fastapi.telemetry import TelemetryConfig
except ImportError:  # pragma: no cover - an older FastAPI: nothing to turn off
    pass
else:
    _OFF: TelemetryConfig = {
        "tracing": False,
        "metrics": False,
        "logs": False,
        "operation_spans": False,
    }
    FRAMEWORK_TELEMETRY_OFF["telemetry"] = _OFF

T = TypeVar("T")
_PRIORITIES = {b"low": "low", b"normal": "normal", b"high": "high"}


class TracedApp:
    """The ASGI app inside a server span per request (see the module docstring)."""

    def __init__(self, app: ASGIApp, bare_routes: frozenset[str]) -> None:
        """`bare_routes`: the paths served without the framework (chat, audio, images),
        each its own route; the control plane's routes are read from the scope."""
        self.app = app
        self.bare_routes = bare_routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope["headers"]
        parent = tracing.extract(headers)
        method = scope["method"]
        if parent is None and method not in ("POST", "DELETE"):
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        attributes: dict[str, str | int] = {
            "http.request.method": method,
            "url.path": path,
            "url.scheme": "http",
        }
        for name, value in headers:
            if name == b"x-priority" and value.lower() in _PRIORITIES:
                attributes["quorum.priority.asked"] = _PRIORITIES[value.lower()]
        route = path if path in self.bare_routes else None
        if route is not None:
            attributes["http.route"] = route
        name = f"{method} {route}" if route else method
        with tracing.span(name, attributes, SpanKind.SERVER, parent) as span:
            answer = _Answer(span, send)
            await self.app(scope, receive, answer.send)
            if route is None and (found := _route_of(scope)) is not None:
                span.set_attribute("http.route", found)
                span.update_name(f"{method} {found}")


class _Answer:
    """Watches the answer going out: its status, its request id, an error's code."""

    __slots__ = ("_send", "span", "status")

    def __init__(self, span: Span, send: Send) -> None:
        self.span = span
        self._send = send
        self.status = 0

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = status = message["status"]
            self.span.set_attribute("http.response.status_code", status)
            for name, value in message.get("headers", ()):
                if name.lower() == b"x-request-id":
                    self.span.set_attribute("quorum.request.id", value.decode("latin-1"))
            if status >= 400:
                tracing.failed(self.span, str(status))
                if status < 500:  # a refusal is the server's answer, not its failure
                    self.span.set_status(Status(StatusCode.UNSET))
        elif kind == "http.response.body" and self.status >= 400:
            code = _error_code(message.get("body", b""))
            if code is not None:
                self.span.set_attribute("error.type", code)
            self.status = 0  # the envelope is the first body message
        await self._send(message)


def _error_code(body: bytes) -> str | None:
    """The runner's error code from its envelope (`{"error": {"code": ...}}`)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    error = doc.get("error") if isinstance(doc, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def _route_of(scope: Scope) -> str | None:
    """The control plane's route template (`/v1/jobs/{job_id}`) once it routed."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else None


async def engine_call(call: ClientCall, engine: ChatEngine, exchange: Awaitable[T]) -> T:
    """`exchange` (one with the engine) awaited inside its client span, current meanwhile
    so that the engine gets its `traceparent`; the chat path calls this only when
    `tracing.ON`, and awaits the exchange bare otherwise."""
    with _engine_span(call, engine):
        return await exchange


@contextmanager
def _engine_span(call: ClientCall, engine: ChatEngine) -> Iterator[None]:
    operation = _OPERATIONS.get(call.scope["path"], "chat")
    attributes: dict[str, str | int] = {
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": call.model,
        "server.address": engine.http.host,
        "server.port": engine.http.port,
    }
    begun = time.perf_counter()
    send = call.send
    first: list[float] = []

    async def timed(message: Message) -> None:
        if not first and message["type"] == "http.response.body" and message.get("body"):
            first.append(time.perf_counter() - begun)
        await send(message)

    with tracing.span(f"{operation} {call.model}", attributes, SpanKind.CLIENT) as span:
        call.send = timed
        try:
            yield
        except BaseException as exc:
            tracing.failed(span, str(getattr(exc, "code", type(exc).__name__)))
            raise
        finally:
            call.send = send
            spent = call.spent
            span.set_attribute("gen_ai.usage.input_tokens", spent.prompt)
            span.set_attribute("gen_ai.usage.output_tokens", spent.completion or spent.generated)
            span.set_attribute("quorum.streamed", spent.streamed)
            if spent.streamed and first:
                span.set_attribute("gen_ai.server.time_to_first_token", round(first[0], 6))
            if spent.cached:
                span.set_attribute("quorum.cache.tokens_reused", spent.cached)
