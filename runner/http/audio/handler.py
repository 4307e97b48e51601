"""POST /v1/audio/transcriptions and /v1/audio/translations: the audio path.

The one front-end (runner/http/frontend.py) calls `AudioPath.serve`; the path asks only the
gate it was handed (runner/http/path_gate.py), never the front-end back. In order:

    1. read and validate the runner's headers; identify the tenant  -> 400 / 401 / 403
    2. Content-Length above the limit                               -> 413 before reading
    3. rate limit (tenants/)                                        -> 429
    4. stream the multipart form, the file to a temporary file      -> 400 / 413 mid-body
    5. validate the fields; the model (`PathGate.check_model`)      -> 400 / 404 / 503
    6. probe the audio (PyAV)                  -> 400 invalid_audio / audio_too_short
    7. admission (`PathGate.admitted`), then the worker (runner/http/audio/service.py)
                                                                    -> 429 / 503 / 502
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

import logging
from collections.abc import Mapping

import orjson

from adapters.speech import Info, Segment, SpeechEngine
from runner.errors import HTTP_ERRORS, error_body, error_status
from runner.http.audio.errors import AudioTooLarge, InvalidForm
from runner.http.audio.formats import (
    JSON,
    SSE,
    delta_text,
    full_text,
    render,
    sse_delta,
    sse_done,
    sse_error,
)
from runner.http.audio.jobs import JOB_KINDS, job_work
from runner.http.audio.metrics import SpeechMetrics
from runner.http.audio.multipart import AudioUpload, FormLimits, read_form
from runner.http.audio.request import TASKS, parse_request
from runner.http.audio.service import Caller, SpeechRun, SpeechService
from runner.http.call import ClientCall, Headers
from runner.http.path_gate import PathGate
from runner.jobs.http import JobSubmitter, wants_async

log = logging.getLogger("quorum.audio")

AUDIO_PATHS = frozenset(TASKS)


class AudioPath:
    """Both audio routes' `serve` (the front-end's `path(serve, json=False)` makes it an
    ASGI app); `service` is the part async jobs reuse."""

    def __init__(
        self,
        gate: PathGate,
        engines: Mapping[str, SpeechEngine],
        metrics: SpeechMetrics,
        limits: FormLimits | None = None,
        submit_job: JobSubmitter | None = None,
    ) -> None:
        self.gate = gate
        self.service = SpeechService(engines, gate.admission, metrics, gone=gate.engine_gone)
        self.metrics = metrics
        self.limits = limits or FormLimits()
        self.submit_job = submit_job

    async def serve(self, call: ClientCall) -> int:
        """Steps 2-8 (1 and 3 are the front-end's); the upload is always discarded, unless
        a job took it."""
        meta = call.meta
        if meta.content_length is not None and meta.content_length > self.limits.max_body_bytes:
            raise AudioTooLarge(limit=self.limits.max_file_bytes)  # 2
        ctype = call.header(b"content-type")
        upload: AudioUpload | None = await read_form(  # 4
            call.receive,
            ctype.encode("latin-1") if ctype else None,
            meta.content_length,
            self.limits,
        )
        assert upload is not None  # read_form returns the upload or raises
        try:
            request = parse_request(upload, TASKS[call.scope["path"]])  # 5
            self.gate.check_model(call, request.model, "audio")
            audio = await self.service.probe(upload.path)  # 6
            webhook = upload.fields.get("webhook") or None
            if self.submit_job is not None and wants_async(call.header(b"prefer")):
                if request.stream:
                    raise InvalidForm("stream=true cannot be an async job", param="stream")
                job_caller = Caller(f"{meta.request_id}-job", call.tenant, meta.priority)
                work = job_work(self.service, request, audio, job_caller, upload)
                answer = await self.submit_job(
                    JOB_KINDS[request.task], call.tenant, request.model, work, webhook
                )
                upload = None  # the job's work owns the file now
                return await _send_job(call, answer)
            if webhook is not None:
                raise InvalidForm("webhook needs 'Prefer: respond-async'", param="webhook")
            caller = Caller(meta.request_id, call.tenant, meta.priority)
            run = SpeechRun(self.service, request, audio, caller)
            return await self._answer(call, run)  # 7, 8
        finally:
            if upload is not None:
                upload.discard()

    async def _answer(self, call: ClientCall, run: SpeechRun) -> int:
        """Steps 7-8 in the request's admission scope (a client gone cancels the run)."""
        answer = _StreamAnswer(call) if run.request.stream else None
        if answer is not None:
            run.on_start = answer.start
            run.on_segment = answer.segment
        try:
            transcript = await run.execute(lambda ticket: self.gate.admitted(call, ticket))
        except HTTP_ERRORS as exc:
            if answer is None or not answer.started:
                raise
            log.warning("transcription stream %s broke: %s", call.request_id, exc)
            await answer.fail(exc)
            return error_status(exc)
        if answer is not None:
            await answer.finish(full_text(transcript.segments))
            return 200
        req = run.request
        body, ctype = render(transcript, req.response_format, req.words)
        headers = _headers(call, run.queue_wait_ms, run.engine_ms, ctype)
        headers.append((b"content-length", b"%d" % len(body)))
        await call.send({"type": "http.response.start", "status": 200, "headers": headers})
        await call.send({"type": "http.response.body", "body": body})
        return 200


class _StreamAnswer:
    """SSE: headers once the worker decoded the audio, a delta per segment, then done."""

    def __init__(self, call: ClientCall) -> None:
        self.call = call
        self.started = False
        self._first = True

    async def start(self, run: SpeechRun, info: Info) -> None:
        headers = _headers(self.call, run.queue_wait_ms, 0, SSE)
        headers.append((b"cache-control", b"no-cache"))
        await self.call.send({"type": "http.response.start", "status": 200, "headers": headers})
        self.started = True

    async def segment(self, segment: Segment) -> None:
        delta = delta_text(segment, self._first)
        if not delta:
            return
        self._first = False
        await self._event(sse_delta(delta))

    async def finish(self, text: str) -> None:
        body = sse_done(text)
        await self.call.send({"type": "http.response.body", "body": body, "more_body": False})

    async def fail(self, exc: BaseException) -> None:
        body = sse_error(error_body(exc))
        await self.call.send({"type": "http.response.body", "body": body, "more_body": False})

    async def _event(self, data: bytes) -> None:
        await self.call.send({"type": "http.response.body", "body": data, "more_body": True})


async def _send_job(
    call: ClientCall, answer: tuple[int, Mapping[str, object], Mapping[str, str]]
) -> int:
    status, doc, extra = answer
    body = orjson.dumps(doc)
    headers = _headers(call, 0, 0, JSON)
    headers += [(k.lower().encode(), v.encode()) for k, v in extra.items()]
    headers.append((b"content-length", b"%d" % len(body)))
    await call.send({"type": "http.response.start", "status": status, "headers": headers})
    await call.send({"type": "http.response.body", "body": body})
    return status


def _headers(call: ClientCall, queue_wait_ms: int, engine_ms: int, ctype: bytes) -> Headers:
    return [
        (b"content-type", ctype),
        (b"x-cache-hit", b"false"),
        (b"x-cache-tokens-reused", b"0"),
        (b"x-queue-wait-ms", b"%d" % queue_wait_ms),
        (b"x-gpu-time-ms", b"%d" % engine_ms),
        (b"x-request-id", call.request_id.encode()),
        *call.limits,
    ]
