"""Transcriptions as async jobs (`Prefer: respond-async`): the work a job runs, its result.

The handler stores nothing itself: it hands `job_work(...)` to a `JobSubmitter`
(`runner.jobs.http`; `job_submitter(manager)` builds one on `runner.jobs.JobManager`),
which answers 202 with the job. The work then
waits for admission inside the job (no HTTP timeout applies), reports progress as audio
seconds done of the total, and deletes the uploaded file when it ends, however it ends.

Result (JSON, as the job store keeps it): the answer the synchronous request would
have given: `{"text": ...}` for json, the verbose_json object, and for text, srt and
vtt `{"format": "srt", "content": "1\\n00:00:00,000 --> ..."}`.
"""

from __future__ import annotations

import orjson

from runner.http.audio.formats import Transcript, render, verbose_json
from runner.http.audio.multipart import AudioUpload
from runner.http.audio.probe import AudioInfo
from runner.http.audio.request import SpeechRequest
from runner.http.audio.service import Caller, SpeechService
from runner.jobs.manager import Work
from runner.jobs.progress import ProgressReporter

JOB_KINDS = {"transcribe": "transcription", "translate": "translation"}


def job_work(
    service: SpeechService,
    request: SpeechRequest,
    audio: AudioInfo,
    caller: Caller,
    upload: AudioUpload,
) -> Work:
    """The job's work; it owns `upload` and discards it at the end."""

    async def work(progress: ProgressReporter) -> object:
        try:
            result = await service.transcribe(request, audio, caller, progress=progress.report)
        finally:
            upload.discard()
        return job_result(result.transcript, request)

    return work


def job_result(transcript: Transcript, request: SpeechRequest) -> object:
    """What the synchronous answer would have carried, as JSON."""
    fmt = request.response_format
    if fmt == "verbose_json":
        return verbose_json(transcript, request.words)
    body, _ = render(transcript, fmt, request.words)
    if fmt == "json":
        return orjson.loads(body)
    return {"format": fmt, "content": body.decode()}
