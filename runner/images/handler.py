"""ASGI handlers: `POST /v1/images/generations` and `GET /v1/images/files/{token}.png`.

`ImagesPath` follows the data path's order (runner/proxy.py):

    1. the runner's headers; the tenant                 -> 400 naming the header, 401/403
    2. the body, bounded                                 -> 413
    3. parse it; the OpenAI fields; route by "model"     -> 400 / 404
    4. rate limit (tenants/)                             -> 429
    5a. `Prefer: respond-async` and a job submitter: the work (admission, then generation)
        becomes a job                                    -> 202 + Location
    5b. otherwise admission (the scheduler's fair queue: ComfyUI's own queue is FIFO, so
        the runner hands it no more than the model's slots at a time) -> 429 / 503
    6. generate; answer 200 with X-Queue-Wait-Ms, X-GPU-Time-Ms (ComfyUI's time from
       submit to end), X-Request-Id, X-Cache-Hit: false, RateLimit-*

Errors answer in the runner's envelope (`runner.asgi.send_error`). A client that goes
away while queued is withdrawn; while its prompt runs, the prompt is interrupted (or
removed from ComfyUI's queue) - `follow.run` does that on cancellation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import orjson

from adapters.comfyui.engine import ComfyUIEngine
from adapters.comfyui.errors import ImageNotFound, InvalidImageRequest
from adapters.comfyui.images import Generated, ImageGenerator, ImageRequest, parse_image_request
from adapters.comfyui.store import FILES_PATH, TOKEN_RE, ImageStore, file_path
from faults import BadRequest, PayloadTooLarge, ServiceUnavailable
from runner.admission import Admission, AdmissionRequest, Grant
from runner.asgi import DisconnectWatch, Receive, Scope, Send, send_error
from runner.errors import HTTP_ERRORS, MethodNotAllowed, ModelNotFound, error_status
from runner.headers import RequestMeta, new_request_id, parse_request_headers
from runner.jobs.http import wants_async
from runner.jobs.progress import ProgressReporter
from runner.metrics import Metrics
from tenants.config import TenantsConfig
from tenants.errors import RateLimitExceeded
from tenants.identity import DEFAULT_TENANT, resolve_tenant
from tenants.ratelimit import RateLimiter

log = logging.getLogger("quorum.comfyui")

IMAGES_PATH = "/v1/images/generations"
JOB_KIND = "image_generation"
Work = Callable[[ProgressReporter], Awaitable[object]]


class JobSubmitter(Protocol):
    """Takes `work` as a job; answers (status, body, headers) - 202 with the job."""

    async def __call__(
        self, kind: str, tenant: str, model: str, work: Work, webhook: str | None
    ) -> tuple[int, Mapping[str, object], Mapping[str, str]]: ...


def job_submitter(manager: Any) -> JobSubmitter:
    """A `JobSubmitter` on the runner's `runner.jobs.JobManager`."""
    from runner.jobs.http import accepted_response

    async def submit(
        kind: str, tenant: str, model: str, work: Work, webhook: str | None
    ) -> tuple[int, Mapping[str, object], Mapping[str, str]]:
        job = await manager.submit(kind, tenant, model, work, webhook)
        answer = accepted_response(job)
        return answer.status, answer.body, answer.headers

    return submit


class _ClientGone(Exception):
    pass


def not_loaded(model: str) -> None:
    """The default `route_missing`: a model that is not here is not loaded."""
    raise ModelNotFound(f"model {model!r} is not loaded")


class ImagesPath:
    """`models` maps model ids to ComfyUI models (kept current by the model pool)."""

    def __init__(
        self,
        models: Mapping[str, ComfyUIEngine],
        generator: ImageGenerator,
        admission: Admission,
        limiter: RateLimiter,
        tenants: TenantsConfig,
        metrics: Metrics,
        max_body_bytes: int,
        *,
        multi_tenant: bool = True,
        route_missing: Callable[[str], None] = not_loaded,
        submit_job: JobSubmitter | None = None,
        public_url: str | None = None,
    ) -> None:
        """`public_url` (e.g. `https://images.example.com`) prefixes the URLs of
        `response_format: url` answers; without it they use the request's Host header."""
        self.models = models
        self.generator = generator
        self.admission = admission
        self.limiter = limiter
        self.tenants = tenants
        self.metrics = metrics
        self.max_body = max_body_bytes
        self.multi_tenant = multi_tenant
        self.route_missing = route_missing
        self.submit_job = submit_job
        self.public_url = public_url.rstrip("/") if public_url else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        meta: RequestMeta | None = None
        model, tenant = "_none", "_invalid"
        limits: list[tuple[bytes, bytes]] = []
        try:
            if scope["method"] != "POST":
                raise MethodNotAllowed(path=IMAGES_PATH, allow="POST")
            meta = parse_request_headers(scope["headers"])  # 1
            tenant = DEFAULT_TENANT
            if self.multi_tenant:
                tenant = resolve_tenant(meta.authorization, meta.tenant_header, self.tenants)
            body = await _read_body(receive, meta, self.max_body)  # 2
            request = self._parse(body)  # 3
            model = request.model
            try:  # 4
                decision = await self.limiter.check(tenant)
            except RateLimitExceeded:
                self.metrics.count_rejection("rate_limited", tenant)
                raise
            limits = self.limiter.headers(decision)
            url_for = self._url_for(scope)
            prefer = _header(scope, b"prefer")
            if self.submit_job is not None and wants_async(prefer):  # 5a
                work = self.job_work(request, tenant, meta, url_for)
                status, doc, headers = await self.submit_job(
                    JOB_KIND, tenant, model, work, request.webhook
                )
                extra = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
                await _send_json(send, status, doc, _headers(meta, 0, 0, limits) + extra)
            else:
                if request.webhook is not None:
                    raise InvalidImageRequest("webhook needs 'Prefer: respond-async'")
                status = await self._serve(
                    receive, send, meta, tenant, limits, request, url_for
                )  # 5b
        except _ClientGone:
            status = 499
        except HTTP_ERRORS as exc:
            status = error_status(exc)
            await send_error(send, exc, meta.request_id if meta else new_request_id(), 0, limits)
        self.metrics.count_request(model, tenant, status)

    def _parse(self, body: bytes) -> ImageRequest:
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise BadRequest("request body must be a JSON object") from None
        if not isinstance(obj, dict):
            raise BadRequest("request body must be a JSON object")
        request = parse_image_request(obj)
        if request.model not in self.models:
            self.route_missing(request.model)
        return request

    def _model(self, model_id: str) -> ComfyUIEngine:
        model = self.models.get(model_id)
        if model is None:
            raise ServiceUnavailable(f"model {model_id!r} is no longer loaded")
        return model

    def _admission_request(
        self, request_id: str, tenant: str, meta: RequestMeta, request: ImageRequest
    ) -> AdmissionRequest:
        return AdmissionRequest(
            request_id,
            request.model,
            tenant,
            meta.priority,
            max(1, len(request.prompt) // 4),
            request.cost,
        )

    async def _serve(
        self,
        receive: Receive,
        send: Send,
        meta: RequestMeta,
        tenant: str,
        limits: list[tuple[bytes, bytes]],
        request: ImageRequest,
        url_for: Callable[[str], str],
    ) -> int:
        """5b-6, with a watcher that cancels this task if the client goes away."""
        task = asyncio.current_task()
        assert task is not None
        watch = DisconnectWatch(task)
        watcher = asyncio.get_running_loop().create_task(watch.run(receive))
        grant: Grant | None = None
        started = time.perf_counter()
        try:
            grant = await self.admission.acquire(
                self._admission_request(meta.request_id, tenant, meta, request)
            )
            self.metrics.begin_request(request.model)
            generated = await self.generator.generate(
                self._model(request.model), request, url_for=url_for
            )
            watch.disarm()
            headers = _headers(meta, grant.queue_wait_ms, generated.engine_ms, limits)
            await _send_json(send, 200, generated.body, headers)
            return 200
        except asyncio.CancelledError:
            if not watch.gone:
                raise
            task.uncancel()
            raise _ClientGone from None
        except HTTP_ERRORS as exc:
            if grant is None:
                raise
            watch.disarm()
            await send_error(send, exc, meta.request_id, grant.queue_wait_ms, limits)
            return error_status(exc)
        finally:
            watch.disarm()
            watcher.cancel()
            if grant is not None:
                self.metrics.end_request(request.model, time.perf_counter() - started)
                self.admission.release(grant, None)

    def _url_for(self, scope: Scope) -> Callable[[str], str]:
        """Absolute image URLs: `public_url`, else the scheme and Host of the request."""
        base = self.public_url
        if base is None:
            host = _header(scope, b"host")
            base = f"{scope.get('scheme', 'http')}://{host}" if host else ""
        return lambda token: base + file_path(token)

    def job_work(
        self,
        request: ImageRequest,
        tenant: str,
        meta: RequestMeta,
        url_for: Callable[[str], str] = file_path,
    ) -> Work:
        """The job's work: wait for a slot in the fair queue, then generate.

        The queue wait happens inside the job, so no HTTP timeout applies to it; the job
        turns RUNNING once it holds a slot.
        """

        async def work(progress: ProgressReporter) -> object:
            job_request_id = f"{meta.request_id}-job"
            grant = await self.admission.acquire(
                self._admission_request(job_request_id, tenant, meta, request)
            )
            try:
                await progress.running()
                generated: Generated = await self.generator.generate(
                    self._model(request.model), request, progress.report, url_for
                )
                return generated.body
            finally:
                self.admission.release(grant, None)

        return work


class ImageFiles:
    """`GET /v1/images/files/{token}.png`: an image kept for `response_format: url`."""

    def __init__(self, store: ImageStore) -> None:
        self.store = store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rid = new_request_id()
        path: str = scope["path"]
        token = path[len(FILES_PATH) :].removesuffix(".png")
        if scope["method"] not in ("GET", "HEAD"):
            await send_error(send, MethodNotAllowed(path=path, allow="GET"), rid)
            return
        data = None
        if path.startswith(FILES_PATH) and path.endswith(".png") and TOKEN_RE.fullmatch(token):
            data = await asyncio.to_thread(self.store.get, token)
        if data is None:
            await send_error(send, ImageNotFound("no such image (or it expired)"), rid)
            return
        headers = [
            (b"content-type", b"image/png"),
            (b"content-length", b"%d" % len(data)),
            (b"cache-control", b"private, max-age=3600"),
            (b"x-request-id", rid.encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send(
            {"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else data}
        )


def _header(scope: Scope, name: bytes) -> str | None:
    values = [v for k, v in scope["headers"] if k == name]
    return ", ".join(v.decode("latin-1") for v in values) if values else None


async def _read_body(receive: Receive, meta: RequestMeta, limit: int) -> bytes:
    if meta.content_length is not None and meta.content_length > limit:
        raise PayloadTooLarge(f"request body is larger than {limit} bytes")
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is larger than {limit} bytes")
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


def _headers(
    meta: RequestMeta, queue_wait_ms: int, engine_ms: int, limits: list[tuple[bytes, bytes]]
) -> list[tuple[bytes, bytes]]:
    return [
        (b"content-type", b"application/json"),
        (b"x-cache-hit", b"false"),
        (b"x-cache-tokens-reused", b"0"),
        (b"x-queue-wait-ms", b"%d" % queue_wait_ms),
        (b"x-gpu-time-ms", b"%d" % engine_ms),
        (b"x-request-id", meta.request_id.encode()),
        *limits,
    ]


async def _send_json(
    send: Send, status: int, doc: Mapping[str, object], headers: list[tuple[bytes, bytes]]
) -> None:
    body = orjson.dumps(doc)
    headers = [*headers, (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
