"""Failures of a speech worker, what it refuses, and the one place worker error codes
become exceptions.

Exception tree::

    QuorumError (faults)
    ├── BadRequest (faults)             400  the worker refused the input (`param` in the
    │   │                                    envelope names the form field), the speech
    │   │                                    facet's rows (adapters/errors.py):
    │   ├── InvalidAudio                     invalid_audio: undecodable or not audio
    │   └── UnsupportedLanguage              unsupported_language: not a Whisper language
    ├── EngineError (adapters)          502
    │   ├── EngineCrashed                    the worker process died mid-request
    │   ├── EngineUnavailable                not started, or stopped mid-request
    │   ├── EngineBadResponse                a frame that is no message
    │   ├── EngineSilent                504  engine_timeout: nothing from the worker on a
    │   │                                    request for ENGINE_READ_TIMEOUT_S (it is killed)
    │   └── TranscriptionFailed              faster-whisper raised (`transcription_failed`)
    └── TranscriptionCancelled          499  stopped by `cancel()` (client gone, job
                                             deleted); never sent to a client
"""

from __future__ import annotations

from adapters.errors import EngineError, InvalidAudio, UnsupportedLanguage
from faults import QuorumError

TranscriptionFailed = EngineError.row("TranscriptionFailed", "transcription_failed")
TranscriptionCancelled = QuorumError.row(
    "TranscriptionCancelled", "cancelled", 499, "the transcription was cancelled"
)


def worker_error(code: str | None, message: str) -> QuorumError:
    """The exception for a `Done` whose `error` is set, by its `error_code`."""
    if code == "invalid_audio":
        return InvalidAudio(message)
    if code == "unsupported_language":
        return UnsupportedLanguage(message)
    if code == "cancelled":
        return TranscriptionCancelled()
    return TranscriptionFailed(message)
