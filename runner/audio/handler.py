"""POST /v1/audio/transcriptions and /v1/audio/translations, as a bare ASGI handler.

Like the data path (runner/proxy.py), in order:

    1. read and validate the runner's headers; identify the tenant  -> 400 / 401 / 403
    2. Content-Length above the limit                               -> 413 before reading
    3. rate limit (tenants/)                                        -> 429
    4. stream the multipart form, the file to a temporary file      -> 400 / 413 mid-body
    5. validate the fields; the model must exist                    -> 400 / 404
    6. probe the audio (PyAV)                  -> 400 invalid_audio / audio_too_short
    7. admission, then the worker (runner/audio/service.py)         -> 429 / 503 / 502
       or, with `Prefer: respond-async` and a job submitter, a job    -> 202 (jobs.py)
    8. answer in `response_format`, or stream SSE deltas, with X-Queue-Wait-Ms,
       X-GPU-Time-Ms (the worker's time), X-Cache-Hit: false, X-Cache-Tokens-Reused: 0

The rate limit comes before the body (an upload is expensive to read), the probe before
admission (a bad file never waits in the queue). A client that disconnects after its
body was read cancels the handler: a queued request is withdrawn, a running
transcription stops at the worker's next segment. The temporary file is always deleted
(by the job's work when a job took the request).

A streamed answer's headers leave when the worker has decoded the audio (errors in
the file still get their 400); they carry X-GPU-Time-Ms: 0, as the time is not known yet.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

import orjson

from adapters.whisper.engine import WhisperEngine
from adapters.whisper.messages import Info, Segment
from runner.admission import Admission
from runner.asgi import DisconnectWatch, Receive, Scope, Send, send_error
from runner.audio.errors import AudioTooLarge, InvalidForm
from runner.audio.formats import (
    JSON,
    SSE,
    delta_text,
    full_text,
    render,
    sse_delta,
    sse_done,
    sse_error,
)
from runner.audio.jobs import JOB_KINDS, JobSubmitter, job_work
from runner.audio.metrics import SpeechMetrics
from runner.audio.multipart import AudioUpload, ClientGone, FormLimits, read_form
from runner.audio.request import TASKS, parse_request
from runner.audio.service import Caller, SpeechRun, SpeechService
from runner.errors import HTTP_ERRORS, error_body, error_status
from runner.headers import RequestMeta, new_request_id, parse_request_headers
from runner.jobs.http import wants_async
from tenants.config import TenantsConfig
from tenants.errors import RateLimitExceeded
from tenants.identity import DEFAULT_TENANT, resolve_tenant
from tenants.ratelimit import RateLimiter

log = logging.getLogger("quorum.audio")

AUDIO_PATHS = frozenset(TASKS)
Headers = list[tuple[bytes, bytes]]


class AudioPath:
    """The ASGI handler for both audio paths; `service` is the part async jobs reuse."""

    def __init__(
        self,
        engines: Mapping[str, WhisperEngine],
        admission: Admission,
        limiter: RateLimiter,
        tenants: TenantsConfig,
        metrics: SpeechMetrics,
        limits: FormLimits | None = None,
        multi_tenant: bool = True,
        route_missing: Callable[[str], None] | None = None,
        submit_job: JobSubmitter | None = None,
    ) -> None:
        self.service = SpeechService(engines, admission, metrics, route_missing)
        self.limiter = limiter
        self.tenants = tenants
        self.metrics = metrics
        self.limits = limits or FormLimits()
        self.multi_tenant = multi_tenant
        self.submit_job = submit_job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        meta: RequestMeta | None = None
        model = "_none"
        tenant = "_invalid"
        limits: Headers = []
        upload: AudioUpload | None = None
        try:
            meta = parse_request_headers(scope["headers"])  # 1
            tenant = self._identify(meta)
            if meta.content_length is not None and meta.content_length > self.limits.max_body_bytes:
                raise AudioTooLarge(limit=self.limits.max_file_bytes)  # 2
            limits = await self._rate_limit(tenant)  # 3
            upload = await read_form(  # 4
                receive, _header(scope, b"content-type"), meta.content_length, self.limits
            )
            request = parse_request(upload, TASKS[scope["path"]])  # 5
            model = request.model
            self.service.check_model(model)
            audio = await self.service.probe(upload.path)  # 6
            caller = Caller(meta.request_id, tenant, meta.priority)
            webhook = upload.fields.get("webhook") or None
            prefer = (_header(scope, b"prefer") or b"").decode("latin-1")
            if self.submit_job is not None and wants_async(prefer):
                if request.stream:
                    raise InvalidForm("stream=true cannot be an async job", param="stream")
                job_caller = Caller(f"{meta.request_id}-job", tenant, meta.priority)
                work = job_work(self.service, request, audio, job_caller, upload)
                answer = await self.submit_job(
                    JOB_KINDS[request.task], tenant, model, work, webhook
                )
                upload = None  # the job's work owns the file now
                status = await _send_job(send, meta, answer, limits)
            else:
                if webhook is not None:
                    raise InvalidForm("webhook needs 'Prefer: respond-async'", param="webhook")
                run = SpeechRun(self.service, request, audio, caller)
                status = await self._serve(receive, send, meta, run, limits)  # 7, 8
        except ClientGone:
            status = 499
        except HTTP_ERRORS as exc:
            status = error_status(exc)
            rid = meta.request_id if meta else new_request_id()
            await send_error(send, exc, rid, extra=limits)
        finally:
            if upload is not None:
                upload.discard()
        self.metrics.count_request(model, tenant, status)

    def _identify(self, meta: RequestMeta) -> str:
        if not self.multi_tenant:
            return DEFAULT_TENANT
        return resolve_tenant(meta.authorization, meta.tenant_header, self.tenants)

    async def _rate_limit(self, tenant: str) -> Headers:
        try:
            decision = await self.limiter.check(tenant)
        except RateLimitExceeded:
            self.metrics.count_rejection("rate_limited", tenant)
            raise
        return self.limiter.headers(decision)

    async def _serve(
        self, receive: Receive, send: Send, meta: RequestMeta, run: SpeechRun, limits: Headers
    ) -> int:
        """Steps 7-8 under a watch that cancels this task if the client goes away."""
        task = asyncio.current_task()
        assert task is not None
        watcher = DisconnectWatch(task)
        watch = asyncio.get_running_loop().create_task(watcher.run(receive))
        answer = _StreamAnswer(send, meta, limits) if run.request.stream else None
        if answer is not None:
            run.on_start = answer.start
            run.on_segment = answer.segment
        try:
            transcript = await run.execute()
            watcher.disarm()
            if answer is not None:
                await answer.finish(full_text(transcript.segments))
                return 200
            req = run.request
            body, ctype = render(transcript, req.response_format, req.words)
            headers = _headers(meta, run.queue_wait_ms, run.engine_ms, ctype, limits)
            headers.append((b"content-length", b"%d" % len(body)))
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return 200
        except asyncio.CancelledError:
            if not watcher.gone:
                raise
            task.uncancel()
            return 499
        except HTTP_ERRORS as exc:
            watcher.disarm()
            if answer is not None and answer.started:
                log.warning("transcription stream %s broke: %s", meta.request_id, exc)
                await answer.fail(exc)
            else:
                await send_error(send, exc, meta.request_id, run.queue_wait_ms, limits)
            return error_status(exc)
        finally:
            watcher.disarm()
            if not watch.done():
                watch.cancel()


class _StreamAnswer:
    """SSE: headers once the worker decoded the audio, a delta per segment, then done."""

    def __init__(self, send: Send, meta: RequestMeta, limits: Headers) -> None:
        self.send = send
        self.meta = meta
        self.limits = limits
        self.started = False
        self._first = True

    async def start(self, run: SpeechRun, info: Info) -> None:
        headers = _headers(self.meta, run.queue_wait_ms, 0, SSE, self.limits)
        headers.append((b"cache-control", b"no-cache"))
        await self.send({"type": "http.response.start", "status": 200, "headers": headers})
        self.started = True

    async def segment(self, segment: Segment) -> None:
        delta = delta_text(segment, self._first)
        if not delta:
            return
        self._first = False
        await self._event(sse_delta(delta))

    async def finish(self, text: str) -> None:
        await self.send({"type": "http.response.body", "body": sse_done(text), "more_body": False})

    async def fail(self, exc: BaseException) -> None:
        body = sse_error(error_body(exc))
        await self.send({"type": "http.response.body", "body": body, "more_body": False})

    async def _event(self, data: bytes) -> None:
        await self.send({"type": "http.response.body", "body": data, "more_body": True})


def _header(scope: Scope, wanted: bytes) -> bytes | None:
    for name, value in scope["headers"]:
        if name == wanted:
            return bytes(value)
    return None


async def _send_job(
    send: Send,
    meta: RequestMeta,
    answer: tuple[int, Mapping[str, object], Mapping[str, str]],
    limits: Headers,
) -> int:
    status, doc, extra = answer
    body = orjson.dumps(doc)
    headers = _headers(meta, 0, 0, JSON, limits)
    headers += [(k.lower().encode(), v.encode()) for k, v in extra.items()]
    headers.append((b"content-length", b"%d" % len(body)))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
    return status


def _headers(
    meta: RequestMeta, queue_wait_ms: int, engine_ms: int, ctype: bytes, limits: Headers
) -> Headers:
    return [
        (b"content-type", ctype),
        (b"x-cache-hit", b"false"),
        (b"x-cache-tokens-reused", b"0"),
        (b"x-queue-wait-ms", b"%d" % queue_wait_ms),
        (b"x-gpu-time-ms", b"%d" % engine_ms),
        (b"x-request-id", meta.request_id.encode()),
        *limits,
    ]
