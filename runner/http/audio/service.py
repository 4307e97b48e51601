"""Transcribe one file for one tenant: the core that HTTP requests and async jobs share.

    service = SpeechService(engines, admission, metrics)
    audio = await service.probe(upload.path)                   # 400s before any queue
    result = await service.transcribe(request, audio, caller, progress=reporter.report)

A run is: wait for admission (the scheduler's queue, fair share, priorities: the request
path's admission scope, `runner.http.admitted.Admitted`, or a plain `Hold` for a job), send
the file to the model's speech engine (its facet, `adapters/speech.SpeechEngine`, whatever
its kind: the "worker" below), collect its segments (calling `on_segment` and
`progress(seconds_done, total)` for each), give the slot back with the audio done.

**Cost.** The scheduler weighs requests in tokens; a transcription's cost is its audio
duration at `COST_UNITS_PER_AUDIO_SECOND` (10) units per second, as input tokens: one
minute of audio weighs like a 600-token prompt. The estimate is the file's full duration;
the usage reported at release is the audio actually transcribed (less when cancelled).

**Cancel.** Cancelling the task that awaits `transcribe` (client gone, job deleted)
withdraws a queued request, or tells the worker to stop at its next segment. The worker
holds its slot until then, so the run's slot does too: the admission scope gives it back
once the worker answered the cancel (`TranscriptionStream.let_go`, handed to `release_when`),
and the next request waits in the runner's queue meanwhile, not inside the worker.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from adapters.errors import EngineCrashed, EngineTimeout, InvalidAudio, UnsupportedLanguage
from adapters.speech import Info, Segment, SpeechEngine, TranscriptionStream
from runner.errors import QuorumError, ServiceUnavailable
from runner.http.asgi import ClientGone
from runner.http.audio.formats import Transcript
from runner.http.audio.metrics import SpeechMetrics
from runner.http.audio.probe import AudioInfo, probe_audio
from runner.http.audio.request import SpeechRequest
from runner.scheduler.grants import Admission, AdmissionRequest, Admit, Hold, Holding, Usage
from runner.telemetry import tracing

COST_UNITS_PER_AUDIO_SECOND = 10

Progress = Callable[[float, float], Awaitable[None]]
"""`progress(seconds_done, seconds_total)`: a job's `ProgressReporter.report` fits."""
OnSegment = Callable[[Segment], Awaitable[None]]
OnStart = Callable[["SpeechRun", Info], Awaitable[None]]


def admission_cost(audio_seconds: float) -> int:
    """Scheduler cost units (input tokens) for `audio_seconds` of audio; at least 1."""
    return max(1, math.ceil(audio_seconds * COST_UNITS_PER_AUDIO_SECOND))


@dataclass(frozen=True, slots=True)
class Caller:
    """Who asks: the request id (also the worker's), the tenant, the priority band."""

    request_id: str
    tenant: str
    priority: str = "normal"


@dataclass(frozen=True, slots=True)
class SpeechResult:
    transcript: Transcript
    engine_ms: int
    queue_wait_ms: int


class SpeechService:
    """Runs speech requests on the workers through admission; see the module docstring."""

    def __init__(
        self,
        engines: Mapping[str, SpeechEngine],
        admission: Admission,
        metrics: SpeechMetrics,
        *,
        gone: Callable[[str], QuorumError] | None = None,
    ) -> None:
        """`gone(model)`: the error for a request granted a slot whose worker died just
        before it was reached (`PathGate.engine_gone`: 503 with Retry-After)."""
        self.engines = engines
        self.admission = admission
        self.metrics = metrics
        self.gone = gone or _not_ready

    async def probe(self, path: str) -> AudioInfo:
        """`probe_audio` in a thread: 400 for undecodable or too-short audio."""
        return await asyncio.to_thread(probe_audio, path)

    async def transcribe(
        self,
        request: SpeechRequest,
        audio: AudioInfo,
        caller: Caller,
        *,
        progress: Progress | None = None,
        on_segment: OnSegment | None = None,
    ) -> SpeechResult:
        """Run one transcription to its end in a plain admission scope (a job's: no
        client to watch); raises its error (4xx/5xx)."""
        run = SpeechRun(self, request, audio, caller, progress=progress, on_segment=on_segment)
        held = functools.partial(Hold, self.admission, metrics=self.metrics)
        transcript = await run.execute(held)
        return SpeechResult(transcript, run.engine_ms, run.queue_wait_ms)


class SpeechRun:
    """One transcription's execution; its fields say how far it got, even when it failed."""

    def __init__(
        self,
        service: SpeechService,
        request: SpeechRequest,
        audio: AudioInfo,
        caller: Caller,
        *,
        on_start: OnStart | None = None,
        on_segment: OnSegment | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.service = service
        self.request = request
        self.audio = audio
        self.caller = caller
        self.on_start = on_start
        self.on_segment = on_segment
        self.progress = progress
        self.held: Holding | None = None
        self.info: Info | None = None
        self.segments: list[Segment] = []
        self.seconds_done = 0.0
        self.engine_ms = 0
        self.outcome = "error"

    @property
    def queue_wait_ms(self) -> int:
        grant = self.held.grant if self.held is not None else None
        return grant.queue_wait_ms if grant is not None else 0

    def ticket(self) -> AdmissionRequest:
        """What admission weighs this run as: its audio seconds (`admission_cost`)."""
        cost = admission_cost(self.audio.duration_s)
        caller = self.caller
        return AdmissionRequest(
            caller.request_id, self.request.model, caller.tenant, caller.priority, cost, 0
        )

    async def execute(self, admit: Admit) -> Transcript:
        """1. admission, in the scope `admit` gives (the request's, or a job's), 2. the
        model's worker (granted: it is ready, unless it died just now), 3. transcribe,
        segment by segment, 4. the slot given back with the audio done, and the outcome
        reported (also on failure and cancellation)."""
        svc, req = self.service, self.request
        try:
            async with admit(self.ticket()) as held:  # 1
                self.held = held
                engine = svc.engines.get(req.model)  # 2
                if engine is None:
                    raise svc.gone(req.model)
                try:
                    transcript = await self._transcribe(engine)  # 3
                finally:  # 4
                    if self.seconds_done:
                        held.usage = Usage(admission_cost(self.seconds_done), 0)
            self.outcome = "ok"
            return transcript
        except (asyncio.CancelledError, ClientGone):  # a job deleted, a client gone
            self.outcome = "cancelled"
            raise
        except (InvalidAudio, UnsupportedLanguage):
            self.outcome = "invalid_audio"
            raise
        except EngineCrashed:
            self.outcome = "engine_crashed"
            raise
        except EngineTimeout:  # the worker was silent and is killed (EngineSilent)
            self.outcome = "engine_timeout"
            raise
        finally:
            rtf = None
            if self.outcome == "ok" and self.info is not None and self.info.duration > 0:
                rtf = (self.engine_ms / 1000) / self.info.duration
            svc.metrics.observe_transcription(
                req.model, self.caller.tenant, self.outcome, self.seconds_done, rtf
            )

    async def _transcribe(self, engine: SpeechEngine) -> Transcript:
        """Step 3; tracing on, inside a client span `{task} {model}` whose context the
        worker gets (`traceparent`, for its log): the audio's seconds, those transcribed,
        the worker's time; never the audio's words."""
        if not tracing.ON:
            return await self._send(engine, None)
        req = self.request
        attributes: tracing.Attributes = {
            "gen_ai.operation.name": req.task,
            "gen_ai.request.model": req.model,
            "quorum.audio.duration_s": self.audio.duration_s,
        }
        with tracing.span(f"{req.task} {req.model}", attributes, tracing.CLIENT) as span:
            carrier: dict[str, str] = {}
            tracing.inject(carrier)
            try:
                return await self._send(engine, carrier.get("traceparent"))
            except Exception as exc:
                tracing.failed(span, str(getattr(exc, "code", type(exc).__name__)))
                raise
            finally:
                span.set_attribute("quorum.audio.seconds_done", self.seconds_done)
                span.set_attribute("quorum.engine_ms", self.engine_ms)

    async def _send(self, engine: SpeechEngine, traceparent: str | None) -> Transcript:
        req = self.request
        transcription = engine.transcribe(
            req.audio_path,
            request_id=self.caller.request_id,
            task=req.task,
            language=req.language,
            prompt=req.prompt,
            temperature=req.temperature,
            word_timestamps=req.words,
            traceparent=traceparent,
        )
        try:
            return await self._collect(transcription)
        finally:  # left early: the slot is the worker's until it answered the cancel
            if not transcription.settled and self.held is not None:
                self.held.release_when(transcription.let_go())

    async def _collect(self, transcription: TranscriptionStream) -> Transcript:
        req = self.request
        async with transcription as t:
            try:
                info = self.info = await t.wait_info()
                if self.on_start is not None:
                    await self.on_start(self, info)
                if self.progress is not None:
                    await self.progress(0.0, info.duration)
                async for segment in t:
                    self.segments.append(segment)
                    self.seconds_done = min(segment.end, info.duration)
                    if self.on_segment is not None:
                        await self.on_segment(segment)
                    if self.progress is not None:
                        await self.progress(self.seconds_done, info.duration)
                self.seconds_done = info.duration
            finally:
                self.engine_ms = t.done.engine_ms if t.done is not None else 0
        if self.progress is not None:
            await self.progress(info.duration, info.duration)
        return Transcript(req.task, info.language, info.duration, tuple(self.segments))


def _not_ready(model: str) -> QuorumError:
    return ServiceUnavailable(f"model {model!r} is not ready; retry shortly")
