"""The image routes: `POST /v1/images/generations` and `GET /v1/images/files/{token}.png`.

The one front-end (runner/http/frontend.py) calls `ImagesPath.serve`, like chat and audio;
the path asks only the gate it was handed (runner/http/path_gate.py), never the front-end
back:

    1. the runner's headers; the tenant; the rate limit   (front-end) -> 400/401/403/429
    2. the body, bounded                                               -> 413
    3. parse it; the OpenAI fields; the model (`PathGate.check_model`); `url` needs the image
       store; the model's own checks (its `ImageShape.check`, adapters/images.py: for
       ComfyUI its workflow's size, batch size, `x_*` it declares)     -> 400 / 404 / 503
    4a. `Prefer: respond-async` and a job submitter: the work (admission, then
        generation) becomes a job, after the same checks as the synchronous request
                                                                       -> 202 + Location
    4b. otherwise admission (`PathGate.admitted`: the scheduler's fair queue; an engine's
        own queue, ComfyUI's, is FIFO, so the runner hands it no more than the model's
        slots at a time)                                               -> 503
    5. generate (the model's images facet, `ImagesEngine.generate`, whatever its kind);
       answer 200 with X-Queue-Wait-Ms, X-GPU-Time-Ms (the engine's time from submit to
       end), X-Request-Id, X-Cache-Hit: false, RateLimit-*

A client that goes away while queued is withdrawn; while its generation runs, the engine
is told to stop (ComfyUI's prompt interrupted or removed from its queue). Its slot stays
taken until the engine let the generation go (an interrupt acts when ComfyUI's running
node ends): `generate` hands that moment to the admission scope (`release_when`), the
synchronous request's and the job's alike.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from adapters.errors import ImageNotFound, InvalidImageRequest
from adapters.image_request import ImageRequest, parse_image_request
from adapters.image_store import FILES_PATH, TOKEN_RE, ImageStore, file_path
from adapters.images import Generated, ImagesEngine, ImageShape
from faults import BadRequest
from runner.errors import MethodNotAllowed
from runner.http.asgi import Receive, Scope, Send, read_body, send_error
from runner.http.call import ClientCall, Headers
from runner.http.headers import new_request_id
from runner.http.json_body import load_json
from runner.http.path_gate import PathGate
from runner.jobs.http import JobSubmitter, wants_async
from runner.jobs.manager import Work
from runner.jobs.progress import ProgressReporter
from runner.scheduler.grants import AdmissionRequest, Hold

IMAGES_PATH = "/v1/images/generations"
JOB_KIND = "image_generation"


class ImagesPath:
    """`POST /v1/images/generations`'s `serve` (the front-end's `path(serve)` makes it an
    ASGI app; the app answers other methods 405). `models` maps model ids to their images
    facet (kept current by the model pool)."""

    def __init__(
        self,
        gate: PathGate,
        models: Mapping[str, ImagesEngine],
        store: ImageStore | None,
        max_body_bytes: int,
        *,
        submit_job: JobSubmitter | None = None,
        public_url: str | None = None,
        count_images: Callable[[str, str, int], None] = lambda _model, _tenant, _n: None,
        shape_of: Callable[[str], ImageShape | None] | None = None,
        job_inline_max_bytes: int | None = None,
    ) -> None:
        """`store` keeps the images answered as URLs (None: `response_format: url` is
        refused). `public_url` (e.g. `https://images.example.com`) prefixes the URLs of
        `response_format: url` answers; without it they use the request's Host header.
        `count_images(model, tenant, n)` counts the images answered (metrics).
        `shape_of(model)`: what its requests are checked and weighed against, loaded or
        not (default: the loaded model's), before they are queued.
        `job_inline_max_bytes`: a job's `b64_json` answer above it is kept as image URLs
        (the job store holds the record, never the images; JOB_RESULT_INLINE_MAX_BYTES)."""
        self.gate = gate
        self.models = models
        self.store = store
        self.max_body = max_body_bytes
        self.submit_job = submit_job
        self.public_url = public_url.rstrip("/") if public_url else None
        self.count_images = count_images
        self.shape_of = shape_of or (lambda model: _loaded_shape(models, model))
        self.job_inline_max_bytes = job_inline_max_bytes

    async def serve(self, call: ClientCall) -> int:
        body = await read_body(call.receive, call.meta.content_length, self.max_body)  # 2
        request = await _parse(body)  # 3
        self.gate.check_model(call, request.model, "images")
        if request.response_format == "url" and self.store is None:
            raise InvalidImageRequest("response_format 'url' is not enabled on this runner")
        shape = self.shape_of(request.model)
        if shape is not None:  # the model's own checks, before a 202 or the queue
            shape.check(request)
        url_for = self._url_for(call)
        if self.submit_job is not None and wants_async(call.header(b"prefer")):  # 4a
            work = self.job_work(request, call, url_for)
            status, doc, location = await self.submit_job(
                JOB_KIND, call.tenant, request.model, work, request.webhook
            )
            extra = [(k.lower().encode(), v.encode()) for k, v in location.items()]
            await _send_json(call.send, status, doc, _headers(call, 0, 0) + extra)
            return status
        if request.webhook is not None:
            raise InvalidImageRequest("webhook needs 'Prefer: respond-async'")
        ticket = _ticket(call.request_id, call, request, shape)
        async with self.gate.admitted(call, ticket) as admitted:  # 4b
            generated = await self._model(request.model).generate(
                request,
                self.store,
                url_for=url_for,
                release_when=admitted.release_when,
                sampling=admitted.progress,
            )  # 5
            admitted.disarm()
            headers = _headers(call, call.queue_wait_ms, generated.engine_ms)
            await _send_json(call.send, 200, generated.body, headers)
        self.count_images(request.model, call.tenant, _images_in(generated))
        return 200

    def _model(self, model_id: str) -> ImagesEngine:
        model = self.models.get(model_id)
        if model is None:  # it died between the grant and now
            raise self.gate.engine_gone(model_id)
        return model

    def _url_for(self, call: ClientCall) -> Callable[[str], str]:
        """Absolute image URLs: `public_url`, else the scheme and Host of the request."""
        base = self.public_url
        if base is None:
            host = call.header(b"host")
            base = f"{call.scope.get('scheme', 'http')}://{host}" if host else ""
        return lambda token: base + file_path(token)

    def job_work(
        self, request: ImageRequest, call: ClientCall, url_for: Callable[[str], str] = file_path
    ) -> Work:
        """The job's work: wait for a slot in the fair queue, then generate.

        The queue wait happens inside the job, so no HTTP timeout applies to it; the job
        turns RUNNING once it holds a slot.
        """
        ticket = _ticket(f"{call.request_id}-job", call, request, self.shape_of(request.model))
        admission, metrics = self.gate.admission, self.gate.metrics

        async def work(progress: ProgressReporter) -> object:
            async with Hold(admission, ticket, metrics=metrics) as held:
                await progress.running()
                generated: Generated = await self._model(request.model).generate(
                    request,
                    self.store,
                    progress.report,
                    url_for,
                    held.release_when,
                    held.progress,
                )
                self.count_images(request.model, call.tenant, _images_in(generated))
                return await self._job_result(generated.body, url_for)

        return work

    async def _job_result(
        self, body: dict[str, Any], url_for: Callable[[str], str]
    ) -> dict[str, Any]:
        """A job's answer as the job store keeps it: above `job_inline_max_bytes` (and with
        an image store), each `b64_json` image is kept in the store and answered as its
        URL, for IMAGES_URL_TTL_S, so a tenant's images never fill the shared Redis."""
        store = self.store
        limit = self.job_inline_max_bytes
        data = body.get("data")
        if store is None or limit is None or not isinstance(data, list):
            return body
        if sum(len(item.get("b64_json", "")) for item in data if isinstance(item, dict)) <= limit:
            return body
        kept = []
        for item in data:
            if isinstance(item, dict) and "b64_json" in item:
                token = await store.keep(base64.b64decode(item["b64_json"]))
                item = {"url": url_for(token)}
            kept.append(item)
        return {**body, "data": kept}


def _loaded_shape(models: Mapping[str, ImagesEngine], model: str) -> ImageShape | None:
    engine = models.get(model)
    return engine.shape if engine is not None else None


def _images_in(generated: Generated) -> int:
    data = generated.body.get("data")
    return len(data) if isinstance(data, list) else 0


async def _parse(body: bytes) -> ImageRequest:
    try:
        obj = await load_json(body)  # a large body off the event loop
    except orjson.JSONDecodeError:
        raise BadRequest("request body must be a JSON object") from None
    if not isinstance(obj, dict):
        raise BadRequest("request body must be a JSON object")
    return parse_image_request(obj)


def _ticket(
    request_id: str, call: ClientCall, request: ImageRequest, shape: ImageShape | None
) -> AdmissionRequest:
    """The admission ticket: the request's cost (fair share: the model's `ImageShape.cost`,
    for ComfyUI n x size x steps at the template's defaults where the request leaves them)
    and, with the model's shape known, its work (`ImageShape.work`), which the wait
    forecast times it by."""
    prompt_tokens = max(1, len(request.prompt) // 4)
    meta = call.meta
    work = shape.work(request) if shape is not None else None
    cost = shape.cost(request) if shape is not None else request.cost
    return AdmissionRequest(
        request_id,
        request.model,
        call.tenant,
        meta.priority,
        prompt_tokens,
        cost,
        work=work,
    )


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


def _headers(call: ClientCall, queue_wait_ms: int, engine_ms: int) -> Headers:
    return [
        (b"content-type", b"application/json"),
        (b"x-cache-hit", b"false"),
        (b"x-cache-tokens-reused", b"0"),
        (b"x-queue-wait-ms", b"%d" % queue_wait_ms),
        (b"x-gpu-time-ms", b"%d" % engine_ms),
        (b"x-request-id", call.request_id.encode()),
        *call.limits,
    ]


async def _send_json(send: Send, status: int, doc: Mapping[str, object], headers: Headers) -> None:
    body = orjson.dumps(doc)
    headers = [*headers, (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
