"""Failures of a speech worker, and the one place worker error codes become exceptions.

Exception tree::

    RunnerError (runner/errors.py)
    ├── BadRequest (runner/audio/errors.py)   400  the worker refused the input:
    │   ├── InvalidAudio                             `invalid_audio` (undecodable file)
    │   └── UnsupportedLanguage                      `unsupported_language`
    ├── EngineError                           502
    │   ├── EngineCrashed (runner)                   the worker process died mid-request
    │   ├── EngineUnavailable (runner)               not started, or stopped mid-request
    │   ├── EngineBadResponse (runner)               a frame that is no message
    │   └── TranscriptionFailed                      faster-whisper raised (`engine_error`)
    └── TranscriptionCancelled                499  stopped by `cancel()` (client gone, job
                                                  deleted); never sent to a client
"""

from __future__ import annotations

from runner.audio.errors import InvalidAudio, UnsupportedLanguage
from runner.errors import EngineError, RunnerError


class TranscriptionFailed(EngineError):
    code = "transcription_failed"


class TranscriptionCancelled(RunnerError):
    status = 499
    code = "cancelled"
    type = "invalid_request_error"


def worker_error(code: str | None, message: str) -> RunnerError:
    """The exception for a `Done` whose `error` is set, by its `error_code`."""
    if code == "invalid_audio":
        return InvalidAudio(message)
    if code == "unsupported_language":
        return UnsupportedLanguage(message)
    if code == "cancelled":
        return TranscriptionCancelled("the transcription was cancelled")
    return TranscriptionFailed(message)
