"""POST /v1/audio/* end to end in-process: the ASGI handler, the real scheduler and rate
limiter, and a real speech worker running tiny.en on espeak-ng speech."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
import pytest_asyncio

from adapters.whisper.engine import WhisperEngine
from runner.http.asgi import ASGIApp
from runner.http.audio.formats import full_text
from runner.http.audio.handler import AudioPath
from runner.http.audio.multipart import FormLimits
from runner.http.audio.request import SpeechRequest
from runner.http.audio.service import Caller
from runner.http.frontend import FrontEnd
from runner.jobs import JobManager, JobNotFound, JobStatus, MemoryJobStore
from runner.jobs.http import job_submitter
from runner.scheduler.admission import SchedulerAdmission
from runner.scheduler.config import SchedulerConfig
from tenants.config import build_config
from tenants.ratelimit import RateLimiter
from tests.adapters.whisper.speech import SpeechFiles, has_words
from tests.runner.http.audio.asgi import Feeder, Response, call, form

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "whisper-tiny.en"
TRANSCRIBE = "/v1/audio/transcriptions"
RUNNER_HEADERS = ("x-queue-wait-ms", "x-gpu-time-ms", "x-request-id")


@dataclass
class RecordingMetrics:
    """Records what the audio path reports (the runner's Metrics implements the same)."""

    requests: list[tuple[str, str, int]] = field(default_factory=list)
    rejections: list[tuple[str, str]] = field(default_factory=list)
    begun: list[str] = field(default_factory=list)
    transcriptions: list[tuple[str, str, str, float, float | None]] = field(default_factory=list)

    def count_request(self, model: str, tenant: str, status: int) -> None:
        self.requests.append((model, tenant, status))

    def count_rejection(self, reason: str, tenant: str) -> None:
        self.rejections.append((reason, tenant))

    def begin_request(self, model: str) -> None:
        self.begun.append(model)

    def end_request(self, model: str, seconds: float) -> None:
        return None

    def observe_transcription(
        self, model: str, tenant: str, outcome: str, audio_seconds: float, rtf: float | None
    ) -> None:
        self.transcriptions.append((model, tenant, outcome, audio_seconds, rtf))

    def count_worker_restart(self, model: str) -> None:
        return None


@dataclass
class Api:
    path: AudioPath  # its `serve`, async jobs' `service`
    app: ASGIApp  # the path behind the front-end
    engines: dict[str, WhisperEngine]
    metrics: RecordingMetrics
    temp_dir: Path
    model_path: str
    admission: SchedulerAdmission

    async def post(
        self,
        audio: Path | bytes,
        path: str = TRANSCRIBE,
        headers: dict[str, str] | None = None,
        extra: dict[str, object] | None = None,
        **fields: object,
    ) -> Response:
        data = audio if isinstance(audio, bytes) else audio.read_bytes()
        body, ctype = form({"model": MODEL, **fields, **(extra or {})}, data)
        return await call(self.app, path, body, ctype, headers)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def api(whisper_model: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Api]:
    """The audio path over one real engine (2 slots), the scheduler and a rate limiter."""
    engine = WhisperEngine(MODEL, whisper_model, parallel=2, cpu_threads=1, load_timeout_s=60)
    await engine.start()
    config = SchedulerConfig(model_concurrency={MODEL: 2}, unlisted_ready=False)
    admission = SchedulerAdmission(config)
    await admission.start()
    tenants = build_config({"TENANT_RATE_LIMIT_slow": "1req/hour"})
    limiter = RateLimiter(tenants)
    metrics = RecordingMetrics()
    temp_dir = tmp_path_factory.mktemp("uploads")
    engines = {MODEL: engine}
    front = FrontEnd(admission, limiter, tenants, metrics)
    path = AudioPath(front.gate, engines, metrics, FormLimits(temp_dir=str(temp_dir)))
    yield Api(
        path,
        front.path(path.serve, json=False),
        engines,
        metrics,
        temp_dir,
        whisper_model,
        admission,
    )
    await admission.stop()
    for e in engines.values():
        await e.stop()
    await limiter.aclose()


def _error(r: Response) -> dict[str, object]:
    error = orjson.loads(r.body)["error"]
    assert isinstance(error, dict)
    return error


def _events(r: Response) -> list[dict[str, object]]:
    return [orjson.loads(e[6:]) for e in r.body.split(b"\n\n") if e.startswith(b"data: ")]


async def test_audio_json_has_the_spoken_words_and_runner_headers(
    api: Api, speech: SpeechFiles
) -> None:
    """json: the spoken words; queue wait, engine time, cache false/0; temp file deleted."""
    r = await api.post(speech.hello, headers={"X-Tenant-ID": "acme"})
    assert r.status == 200, r.body
    assert has_words(orjson.loads(r.body)["text"])
    assert all(h in r.headers for h in RUNNER_HEADERS)
    assert int(r.headers["x-gpu-time-ms"]) > 0
    assert r.headers["x-cache-hit"] == "false" and r.headers["x-cache-tokens-reused"] == "0"
    assert r.headers["content-type"] == "application/json"
    assert not os.listdir(api.temp_dir)
    model, tenant, outcome, seconds, rtf = api.metrics.transcriptions[-1]
    assert (model, tenant, outcome) == (MODEL, "acme", "ok")
    assert seconds > 2 and rtf is not None and rtf > 0
    assert api.metrics.requests[-1] == (MODEL, "acme", 200)


@pytest.mark.parametrize(
    ("response_format", "starts"),
    [("text", ""), ("srt", "1\n00:00:"), ("vtt", "WEBVTT\n\n00:00:")],
)
async def test_audio_text_srt_vtt_carry_the_words(
    api: Api, speech: SpeechFiles, response_format: str, starts: str
) -> None:
    """text, srt and vtt answers hold the spoken words in their own layout."""
    r = await api.post(speech.hello, response_format=response_format)
    assert r.status == 200, r.body
    text = r.body.decode()
    assert text.startswith(starts) and has_words(text)
    assert " --> " in text or response_format == "text"


async def test_audio_verbose_json_has_segments_and_words(api: Api, speech: SpeechFiles) -> None:
    """verbose_json: task, language, duration, segments with start/end; words when asked."""
    words: dict[str, object] = {"timestamp_granularities[]": "word"}
    r = await api.post(speech.hello, response_format="verbose_json", extra=words)
    assert r.status == 200, r.body
    out = orjson.loads(r.body)
    assert out["task"] == "transcribe" and out["language"] == "english"
    assert 2 < out["duration"] < 5 and has_words(out["text"])
    assert out["segments"] and all(s["start"] <= s["end"] for s in out["segments"])
    assert {"hello", "world"} & {w["word"].lower().strip(".,") for w in out["words"]}


async def test_audio_stream_sends_deltas_then_the_full_text(api: Api, speech: SpeechFiles) -> None:
    """stream=true: SSE transcript.text.delta events, then transcript.text.done with the text."""
    r = await api.post(speech.medium, stream="true")
    assert r.status == 200 and r.headers["content-type"] == "text/event-stream"
    events = _events(r)
    deltas = [e for e in events if e["type"] == "transcript.text.delta"]
    assert len(deltas) >= 2 and events[-1]["type"] == "transcript.text.done"
    text = events[-1]["text"]
    assert isinstance(text, str) and text == "".join(str(d["delta"]) for d in deltas).strip()
    assert "morning" in text.lower() and "school" in text.lower()
    assert len(r.chunks) >= len(deltas)  # each delta left as its own write


async def test_audio_translation_answers_english_text(api: Api, speech: SpeechFiles) -> None:
    """/v1/audio/translations answers the (English) speech as text."""
    r = await api.post(speech.hello, path="/v1/audio/translations")
    assert r.status == 200, r.body
    assert has_words(orjson.loads(r.body)["text"])


async def test_audio_mp3_header_on_random_bytes_is_400(api: Api, speech: SpeechFiles) -> None:
    """A corrupt MP3 is refused with 400 invalid_audio before it is queued."""
    begun = len(api.metrics.begun)
    r = await api.post(speech.bad_mp3)
    assert r.status == 400
    error = _error(r)
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_audio"
    assert "could not be" in str(error["message"]) and error["param"] == "file"
    assert len(api.metrics.begun) == begun
    assert not os.listdir(api.temp_dir)


async def test_audio_too_short_is_400_audio_too_short(api: Api, speech: SpeechFiles) -> None:
    """0.05 s of audio: 400 with OpenAI's code audio_too_short."""
    r = await api.post(speech.short)
    assert r.status == 400 and _error(r)["code"] == "audio_too_short"


async def test_audio_30_mib_with_content_length_is_413_unread(api: Api) -> None:
    """A 30 MiB body announced by Content-Length: 413 before a byte is read."""
    body, ctype = form({"model": MODEL}, b"\0" * (30 * 1024 * 1024))
    feeder = Feeder(body)
    r = await call(api.app, TRANSCRIBE, body, ctype, feeder=feeder)
    assert r.status == 413 and _error(r)["code"] == "payload_too_large"
    assert feeder.calls == 0


async def test_audio_30_mib_streamed_is_413_before_it_is_stored(api: Api) -> None:
    """A 30 MiB body without Content-Length: 413 once 25 MiB passed; the rest is never
    read and the temporary directory is empty afterwards."""
    body, ctype = form({"model": MODEL}, b"\0" * (30 * 1024 * 1024))
    feeder = Feeder(body, chunk=256 * 1024)
    r = await call(api.app, TRANSCRIBE, body, ctype, feeder=feeder, content_length=False)
    assert r.status == 413
    assert feeder.pulled <= 26_214_400 + 64 * 1024 + feeder.chunk < len(body)
    assert not os.listdir(api.temp_dir)


async def test_audio_unknown_model_is_404(api: Api, speech: SpeechFiles) -> None:
    """A model with no engine: 404 model_not_found naming the loaded ones."""
    body, ctype = form({"model": "whisper-large"}, speech.hello.read_bytes())
    r = await call(api.app, TRANSCRIBE, body, ctype)
    assert r.status == 404 and MODEL in str(_error(r)["message"])


async def test_audio_rate_limit_refuses_before_the_body(api: Api, speech: SpeechFiles) -> None:
    """Over its rate limit a tenant gets 429 with Retry-After, its upload left unread."""
    first = await api.post(speech.short, headers={"X-Tenant-ID": "slow"})
    assert first.status == 400  # counted: the limit is 1 request per hour
    body, ctype = form({"model": MODEL}, speech.hello.read_bytes())
    feeder = Feeder(body)
    r = await call(api.app, TRANSCRIBE, body, ctype, {"X-Tenant-ID": "slow"}, feeder=feeder)
    assert r.status == 429 and "retry-after" in r.headers
    assert feeder.calls == 0


async def test_audio_client_gone_cancels_the_transcription(api: Api, speech: SpeechFiles) -> None:
    """A client leaving after the first streamed delta stops the worker's transcription."""
    engine = api.engines[MODEL]
    body, ctype = form({"model": MODEL, "stream": "true"}, speech.long.read_bytes())
    feeder = Feeder(body)

    def first_delta(r: Response, chunk: bytes) -> None:
        if b"transcript.text.delta" in chunk:
            feeder.disconnect()

    r = await call(api.app, TRANSCRIBE, body, ctype, feeder=feeder, on_chunk=first_delta)
    assert r.status == 200 and not r.complete.is_set()
    assert api.metrics.requests[-1][2] == 499
    _, _, outcome, seconds, _ = api.metrics.transcriptions[-1]
    assert outcome == "cancelled" and seconds < 50
    await engine.idle()  # the worker answered the cancel
    for _ in range(100):  # its log line arrives through the supervisor's pipe
        if any("cancelled after" in line for line in engine.logs()):
            break
        await asyncio.sleep(0.02)
    assert any("cancelled after" in line for line in engine.logs())
    assert not os.listdir(api.temp_dir)


async def test_audio_client_gone_keeps_the_slot_until_the_worker_answered(
    api: Api, speech: SpeechFiles
) -> None:
    """The worker stops a cancelled transcription only at its next segment: the request's
    slot stays taken until the worker answered the cancel, never freed while the worker
    still holds it, then given back."""
    engine = api.engines[MODEL]
    body, ctype = form({"model": MODEL, "stream": "true"}, speech.long.read_bytes())
    feeder = Feeder(body)

    def first_delta(r: Response, chunk: bytes) -> None:
        if b"transcript.text.delta" in chunk:
            feeder.disconnect()

    def held() -> int:
        return api.admission.stats().in_flight.get(MODEL, 0)

    r = await call(api.app, TRANSCRIBE, body, ctype, feeder=feeder, on_chunk=first_delta)
    assert r.status == 200 and api.metrics.requests[-1][2] == 499
    assert held() >= engine.in_flight  # the handler is done; the worker may not be
    await engine.idle()
    async with asyncio.timeout(10):
        while held():
            await asyncio.sleep(0.01)


async def test_audio_killed_worker_is_502_and_a_new_engine_serves(
    api: Api, speech: SpeechFiles
) -> None:
    """SIGKILL of the worker mid-request: 502 engine_crashed naming the signal; the next
    request on a freshly started engine succeeds."""
    doomed = WhisperEngine(MODEL, api.model_path, parallel=1, cpu_threads=1)
    await doomed.start()
    healthy = api.engines[MODEL]
    api.engines[MODEL] = doomed

    async def kill_when_busy() -> None:
        while doomed.in_flight == 0:  # a real process: no clock to move
            await asyncio.sleep(0.01)
        assert doomed.pid is not None
        os.kill(doomed.pid, signal.SIGKILL)

    killer = asyncio.create_task(kill_when_busy())
    try:
        r = await api.post(speech.long)
        await killer
        assert r.status == 502
        error = _error(r)
        assert error["code"] == "engine_crashed" and "SIGKILL" in str(error["message"])
        assert api.metrics.transcriptions[-1][2] == "engine_crashed"
    finally:
        killer.cancel()
        await doomed.stop()
        api.engines[MODEL] = healthy
    fresh = WhisperEngine(MODEL, api.model_path, parallel=1, cpu_threads=1)
    await fresh.start()
    api.engines[MODEL] = fresh
    try:
        r = await api.post(speech.hello)
        assert r.status == 200 and has_words(orjson.loads(r.body)["text"])
    finally:
        await fresh.stop()
        api.engines[MODEL] = healthy


async def test_audio_killed_worker_mid_stream_ends_with_an_error_event(
    api: Api, speech: SpeechFiles
) -> None:
    """SIGKILL after the first streamed delta: the stream ends with an engine_crashed event."""
    doomed = WhisperEngine(MODEL, api.model_path, parallel=1, cpu_threads=1)
    await doomed.start()
    healthy = api.engines[MODEL]
    api.engines[MODEL] = doomed

    def kill_on_first_delta(r: Response, chunk: bytes) -> None:
        if b"transcript.text.delta" in chunk and doomed.pid is not None:
            os.kill(doomed.pid, signal.SIGKILL)

    try:
        body, ctype = form({"model": MODEL, "stream": "true"}, speech.long.read_bytes())
        r = await call(api.app, TRANSCRIBE, body, ctype, on_chunk=kill_on_first_delta)
    finally:
        await doomed.stop()
        api.engines[MODEL] = healthy
    assert r.status == 200 and r.complete.is_set()
    last = _events(r)[-1]
    assert "error" in last and last["error"]["code"] == "engine_crashed"  # type: ignore[index]


async def test_audio_respond_async_is_a_job_with_progress_and_result(
    api: Api, speech: SpeechFiles
) -> None:
    """Prefer: respond-async -> 202 with the job; the job ends succeeded with the text,
    its progress at the audio's total seconds; another tenant cannot read it."""
    manager = JobManager(MemoryJobStore(time.time), None, "audio-test", time.time)
    api.path.submit_job = job_submitter(manager)
    try:
        r = await api.post(
            speech.medium,
            headers={"Prefer": "respond-async", "X-Tenant-ID": "acme"},
            response_format="srt",
        )
        assert r.status == 202, r.body
        doc = orjson.loads(r.body)
        assert r.headers["location"].endswith(doc["id"])
        await manager.join(doc["id"])
        job = await manager.get(doc["id"], "acme")
        assert job.status is JobStatus.SUCCEEDED, job
        assert isinstance(job.result, dict) and job.result["format"] == "srt"
        assert "morning" in job.result["content"].lower()
        assert job.progress is not None and job.progress.fraction == 1.0
        assert job.progress.total == pytest.approx(22.0, abs=10)
        with pytest.raises(JobNotFound):
            await manager.get(doc["id"], "intruder")
        assert not os.listdir(api.temp_dir)  # the job's work deleted the upload
    finally:
        api.path.submit_job = None
        await manager.aclose()


@pytest.mark.parametrize("which", ["bad_mp3", "short"])
async def test_audio_respond_async_refuses_before_the_202_as_the_sync_form(
    api: Api, speech: SpeechFiles, which: str
) -> None:
    """With `Prefer: respond-async`, audio the synchronous request refuses (corrupt, too
    short) gets the same 400 before any 202: no job is created, the upload is gone."""
    jobs = MemoryJobStore(time.time)
    manager = JobManager(jobs, None, "audio-test", time.time)
    api.path.submit_job = job_submitter(manager)
    audio = getattr(speech, which)
    try:
        sync = await api.post(audio)
        async_form = await api.post(audio, headers={"Prefer": "respond-async"})
        assert sync.status == async_form.status == 400, async_form.body
        assert _error(async_form) == _error(sync)
        assert "location" not in async_form.headers and len(jobs) == 0
        assert not os.listdir(api.temp_dir)
    finally:
        api.path.submit_job = None
        await manager.aclose()


async def test_audio_core_reports_progress_in_audio_seconds(api: Api, speech: SpeechFiles) -> None:
    """The shared core calls progress(seconds done, total) from 0 up to the total."""
    progress: list[tuple[float, float]] = []

    async def report(done: float, total: float) -> None:
        progress.append((done, total))

    audio = await api.path.service.probe(str(speech.medium))
    request = SpeechRequest("transcribe", MODEL, str(speech.medium), "medium.wav")
    result = await api.path.service.transcribe(
        request, audio, Caller("core-1", "acme"), progress=report
    )
    assert "morning" in full_text(result.transcript.segments).lower()
    assert progress[0][0] == 0.0 and progress[0][1] == pytest.approx(audio.duration_s, abs=0.1)
    assert progress[-1][0] == progress[-1][1] and len(progress) >= 3
    assert [d for d, _ in progress] == sorted(d for d, _ in progress)


async def test_audio_webhook_without_respond_async_is_400(api: Api, speech: SpeechFiles) -> None:
    """A webhook field on a synchronous request is refused, naming the field."""
    r = await api.post(speech.hello, webhook="https://example.com/hook")
    assert r.status == 400 and _error(r)["param"] == "webhook"
