"""The data path: OpenAI-compatible inference, forwarded to the model's engine.

This is the hot path, written as a bare ASGI handler (no framework routing,
no request objects): every request pays for it, so it does only what the
features need.

    1. read and validate the runner's headers; identify the tenant
                                                       -> 400 naming the header, 401/403
    2. read the body, bounded                          -> 413
    3. parse it once; route by "model"                 -> 400 / 404
    4. drop `x_*` extension fields, let the adapter adjust; re-serialize only if changed
    5. rate limit (tenants/), then admission (the scheduler's queue)
                                                       -> 429 / 503 + Retry-After
    6. forward; stream chunk by chunk, or read the JSON answer and its cache report
    7. answer with the engine's status and body plus X-Cache-*, X-Queue-Wait-Ms,
       X-GPU-Time-Ms, X-Request-Id

A client that disconnects at any point after its body was read cancels the
handler: while queued it is withdrawn, while served the engine connection is
dropped (the engine then aborts the generation).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from adapters.base import NO_REPORT, CacheReport, Engine, Placement
from adapters.errors import EngineBadResponse
from adapters.http_client import ClientFailure, translate_failure
from faults import QuorumError
from runner.admission import Admission, AdmissionRequest, Grant, Usage
from runner.asgi import (
    FALSE_REPORT_HEADERS,
    JSON,
    DisconnectWatch,
    Receive,
    Scope,
    Send,
    send_error,
    send_whole,
)
from runner.errors import (
    HTTP_ERRORS,
    BadRequest,
    ModelNotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    error_body,
    error_status,
)
from runner.headers import RequestMeta, new_request_id, parse_request_headers
from runner.metrics import Metrics
from tenants.config import TenantsConfig
from tenants.errors import RateLimitExceeded
from tenants.identity import DEFAULT_TENANT, resolve_tenant
from tenants.ratelimit import RateLimiter

log = logging.getLogger("quorum.proxy")

INFERENCE_PATHS: dict[str, str] = {
    "/v1/chat/completions": "/v1/chat/completions",
    "/v1/completions": "/v1/completions",
    "/v1/embeddings": "/v1/embeddings",
}
_SSE = b"text/event-stream"


class _ClientGone(Exception):
    """The client disconnected; nothing more is sent to it."""


class DataPath:
    """`engines` holds the ready engines (the model pool keeps it current).

    `route_missing(model)` is asked about a model with no ready engine: it raises the right
    404 (unknown, or known but not loaded), or returns when the request may wait in the
    queue for the model to load (it is loading, or marked `autoload`).
    """

    def __init__(
        self,
        engines: Mapping[str, Engine],
        admission: Admission,
        limiter: RateLimiter,
        tenants: TenantsConfig,
        metrics: Metrics,
        max_body_bytes: int,
        multi_tenant: bool = True,
        route_missing: Callable[[str], None] | None = None,
    ) -> None:
        self.engines = engines
        self.route_missing = route_missing or self._not_loaded
        self.admission = admission
        self.limiter = limiter
        self.tenants = tenants
        self.multi_tenant = multi_tenant
        self.metrics = metrics
        self.max_body = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        meta: RequestMeta | None = None
        model = "_none"
        tenant = "_invalid"
        limits: list[tuple[bytes, bytes]] = []
        try:
            meta = parse_request_headers(scope["headers"])  # 1
            tenant = self._identify(meta)
            body = await self._read_body(receive, meta)  # 2
            model, engine, obj = self._route(body)  # 3
            changed = _strip_extensions(obj)  # 4
            if engine is not None:
                changed |= engine.rewrite(obj, meta.cache_mode, tenant)
            if changed:
                body = orjson.dumps(obj)
            limits = await self._rate_limit(tenant)  # 5
            status = await self._serve(
                scope, receive, send, meta, tenant, limits, model, engine, obj, body
            )
        except _ClientGone:
            status = 499
        except HTTP_ERRORS as exc:
            status = error_status(exc)
            rid = meta.request_id if meta else new_request_id()
            await send_error(send, exc, rid, extra=limits)
        self.metrics.count_request(model, tenant, status)

    def _identify(self, meta: RequestMeta) -> str:
        if not self.multi_tenant:
            return DEFAULT_TENANT
        return resolve_tenant(meta.authorization, meta.tenant_header, self.tenants)

    async def _rate_limit(self, tenant: str) -> list[tuple[bytes, bytes]]:
        try:
            decision = await self.limiter.check(tenant)
        except RateLimitExceeded:
            self.metrics.count_rejection("rate_limited", tenant)
            raise
        return self.limiter.headers(decision)

    async def _read_body(self, receive: Receive, meta: RequestMeta) -> bytes:
        limit = self.max_body
        if meta.content_length is not None and meta.content_length > limit:
            raise PayloadTooLarge(f"request body is larger than {limit} bytes")
        message = await receive()
        body: bytes = message.get("body", b"")
        if not message.get("more_body", False):
            if message["type"] == "http.disconnect":
                raise _ClientGone
            if len(body) > limit:
                raise PayloadTooLarge(f"request body is larger than {limit} bytes")
            return body
        parts = [body]
        size = len(body)
        while message.get("more_body", False):
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body is larger than {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    def _not_loaded(self, model: str) -> None:
        """Without a model pool: a model with no ready engine is unknown."""
        loaded = ", ".join(sorted(self.engines)) or "none"
        raise ModelNotFound(f"model {model!r} is not loaded; loaded models: {loaded}")

    def _route(self, body: bytes) -> tuple[str, Engine | None, dict[str, Any]]:
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise BadRequest("request body must be a JSON object") from None
        if not isinstance(obj, dict):
            raise BadRequest("request body must be a JSON object")
        model = obj.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("the 'model' field is required and must be a string")
        engine = self.engines.get(model)
        if engine is None:
            self.route_missing(model)  # raises the 404, or the request waits for a load
        return model, engine, obj

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        meta: RequestMeta,
        tenant: str,
        limits: list[tuple[bytes, bytes]],
        model: str,
        engine: Engine | None,
        obj: dict[str, Any],
        body: bytes,
    ) -> int:
        """Steps 5-7, with a watcher that cancels this task if the client goes away."""
        task = asyncio.current_task()
        assert task is not None
        watcher = DisconnectWatch(task)
        asyncio.get_running_loop().create_task(watcher.run(receive))
        grant: Grant | None = None
        placement: Placement | None = None
        report = NO_REPORT
        started = time.perf_counter()
        try:
            request = AdmissionRequest(
                meta.request_id,
                model,
                tenant,
                meta.priority,
                _estimate_input_tokens(body),
                _estimate_output_tokens(obj),
            )
            grant = await self.admission.acquire(request)  # 5
            self.metrics.begin_request(model)
            current = self.engines.get(model)
            if current is not engine:  # loaded, restarted, failed or unloaded meanwhile
                if current is None:
                    self.route_missing(model)  # raises why (failed: the reason), or:
                    raise ServiceUnavailable(f"model {model!r} is not ready; retry shortly")
                engine = current
                if engine.rewrite(obj, meta.cache_mode, tenant):
                    body = orjson.dumps(obj)
            assert engine is not None
            placement = await engine.place(body, obj, tenant, meta.cache_tag)
            path = scope["path"]
            forward = self._forward_stream if obj.get("stream") is True else self._forward_json
            status, report = await forward(
                send, meta, grant, engine, limits, path, placement, watcher
            )
            return status
        except asyncio.CancelledError:
            if not watcher.gone:
                raise
            task.uncancel()
            raise _ClientGone from None
        except HTTP_ERRORS as exc:
            if grant is None:
                raise
            # After admission the error still carries the measured queue wait.
            watcher.disarm()
            await send_error(send, exc, meta.request_id, grant.queue_wait_ms, limits)
            return error_status(exc)
        finally:
            watcher.disarm()
            if placement is not None and engine is not None:
                engine.done(placement, report)
            if grant is not None:
                self.metrics.end_request(model, time.perf_counter() - started)
                usage = None
                if report.input_tokens or report.output_tokens:
                    usage = Usage(report.input_tokens, report.output_tokens)
                    self.metrics.count_tokens(tenant, report.input_tokens, report.output_tokens)
                self.admission.release(grant, usage)

    async def _forward_json(
        self,
        send: Send,
        meta: RequestMeta,
        grant: Grant,
        engine: Engine,
        limits: list[tuple[bytes, bytes]],
        path: str,
        placement: Placement,
        watcher: DisconnectWatch,
    ) -> tuple[int, CacheReport]:
        model = grant.request.model
        try:
            resp = await engine.http.post(path, placement.body)
            try:
                payload = await resp.read()
            finally:
                resp.release()
        except ClientFailure as exc:
            raise await _translate(exc, engine) from None
        status = resp.status
        report = NO_REPORT
        if status == 200:
            try:
                parsed = orjson.loads(payload)
            except orjson.JSONDecodeError:
                raise EngineBadResponse(
                    f"engine for model {model!r} returned a body that is not JSON"
                ) from None
            if isinstance(parsed, dict):
                report = engine.report(parsed)
        watcher.disarm()
        ctype = resp.header(b"content-type", JSON)
        await send_whole(
            send, status, _response_headers(meta, grant, report, ctype, limits), payload
        )
        if report.cache_hit:
            self.metrics.count_cache(model, report.tokens_reused)
        return status, report

    async def _forward_stream(
        self,
        send: Send,
        meta: RequestMeta,
        grant: Grant,
        engine: Engine,
        limits: list[tuple[bytes, bytes]],
        path: str,
        placement: Placement,
        watcher: DisconnectWatch,
    ) -> tuple[int, CacheReport]:
        """Stream the engine's answer chunk by chunk.

        The headers leave with the first chunk; an engine whose first chunk carries the
        cache report (`holds_headers_for_first_chunk`) has it read first, so the headers
        say what the engine reused. The final chunk's usage/timings then correct the
        report the scheduler and metrics get.
        """
        model = grant.request.model
        report = NO_REPORT
        try:
            resp = await engine.http.post(path, placement.body)
        except ClientFailure as exc:
            raise await _translate(exc, engine) from None
        strip = placement.strip
        try:
            if resp.status != 200:
                try:
                    payload = await resp.read()
                except ClientFailure as exc:
                    raise await _translate(exc, engine) from None
                watcher.disarm()
                ctype = resp.header(b"content-type", JSON)
                headers = _response_headers(meta, grant, NO_REPORT, ctype, limits)
                await send_whole(send, resp.status, headers, payload)
                return resp.status, NO_REPORT
            ctype = resp.header(b"content-type", _SSE)
            chunks = resp.chunks()
            first = b""
            if engine.holds_headers_for_first_chunk:
                try:
                    first = await anext(chunks, b"")
                except ClientFailure as exc:
                    raise await _translate(exc, engine) from None
                report = engine.first_chunk_report(first) or NO_REPORT
            headers = _response_headers(meta, grant, report, ctype, limits)
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            if report.cache_hit:
                self.metrics.count_cache(model, report.tokens_reused)
            try:
                if strip is not None:
                    first = strip(first)
                if first:
                    await send({"type": "http.response.body", "body": first, "more_body": True})
                async for chunk in chunks:
                    has_usage = b'"usage"' in chunk
                    if has_usage:  # read before `strip` may take it out
                        report = _sniff_report(engine, chunk) or report
                    if strip is not None and (has_usage or b'"prompt_progress"' in chunk):
                        chunk = strip(chunk)
                        if not chunk.strip():
                            continue
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except ClientFailure as exc:
                error = await _translate(exc, engine)
                log.warning("stream from %s broke: %s", model, error)
                watcher.disarm()
                event = b"data: " + error_body(error) + b"\n\n"
                await send({"type": "http.response.body", "body": event, "more_body": False})
                return 502, report
        finally:
            resp.release()
        watcher.disarm()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return 200, report


async def _translate(exc: ClientFailure, engine: Engine) -> QuorumError:
    """The engine client's failure as a runner error; when the engine process died, say so
    (the supervisor may need a moment to see the exit that reset the connection)."""
    failure = engine.failure or await engine.diagnose()
    return translate_failure(exc, engine.model_id, failure)


def _strip_extensions(obj: dict[str, Any]) -> bool:
    """Remove body fields named `x_*` (runner extensions, never sent to engines)."""
    drop = [k for k in obj if k.startswith("x_")]
    for k in drop:
        del obj[k]
    return bool(drop)


def _estimate_input_tokens(body: bytes) -> int:
    """A cheap estimate until the engine reports real usage: ~4 bytes per token."""
    return max(1, len(body) // 4)


def _estimate_output_tokens(obj: dict[str, Any]) -> int:
    for key in ("max_completion_tokens", "max_tokens", "n_predict"):
        v = obj.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return 256


def _response_headers(
    meta: RequestMeta,
    grant: Grant,
    report: CacheReport,
    ctype: bytes,
    limits: list[tuple[bytes, bytes]],
) -> list[tuple[bytes, bytes]]:
    """The runner's headers on an answer: cache report, queue wait, GPU time, ids, limits."""
    if report.cache_hit:
        headers = [
            (b"x-cache-hit", b"true"),
            (b"x-cache-tokens-reused", b"%d" % report.tokens_reused),
        ]
    else:
        headers = list(FALSE_REPORT_HEADERS)
    headers += [
        (b"content-type", ctype),
        (b"x-queue-wait-ms", b"%d" % grant.queue_wait_ms),
        (b"x-gpu-time-ms", b"%d" % report.gpu_time_ms),
        (b"x-request-id", meta.request_id.encode()),
    ]
    headers += limits
    return headers


def _sniff_report(engine: Engine, chunk: bytes) -> CacheReport | None:
    """Find the usage block in a streamed chunk (the final one carries it)."""
    for line in chunk.split(b"\n"):
        if line.startswith(b"data: {") and b'"usage"' in line:
            try:
                parsed = orjson.loads(line[6:])
            except orjson.JSONDecodeError:
                continue
            if isinstance(parsed, dict) and isinstance(parsed.get("usage"), dict):
                return engine.report(parsed)
    return None
