"""Errors of the audio API (OpenAI's shapes) and of its request form.

Exception tree::

    RunnerError (runner/errors.py)
    ├── BadRequest                     400  invalid_request_error
    │   ├── InvalidForm                400  invalid_request: a missing or bad form field (named)
    │   ├── InvalidAudio               400  invalid_audio: undecodable or not audio (says why)
    │   ├── AudioTooShort              400  audio_too_short: under 0.1 s (OpenAI's code)
    │   └── UnsupportedLanguage        400  unsupported_language: not a Whisper language
    └── PayloadTooLarge                413  payload_too_large: body over AUDIO_MAX_BYTES

`param` (the form field at fault) rides in the envelope, as OpenAI's errors carry it.
The engine side's failures (crash, worker error) are in adapters/whisper/errors.py.
"""

from __future__ import annotations

from runner.errors import BadRequest, PayloadTooLarge


class InvalidForm(BadRequest):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message, extra={"param": param})


class InvalidAudio(BadRequest):
    code = "invalid_audio"

    def __init__(self, message: str) -> None:
        super().__init__(message, extra={"param": "file"})


class AudioTooShort(BadRequest):
    code = "audio_too_short"

    def __init__(self, message: str) -> None:
        super().__init__(message, extra={"param": "file"})


class UnsupportedLanguage(BadRequest):
    code = "unsupported_language"

    def __init__(self, message: str) -> None:
        super().__init__(message, extra={"param": "language"})


class AudioTooLarge(PayloadTooLarge):
    def __init__(self, limit: int) -> None:
        super().__init__(
            f"Maximum content size limit ({limit} bytes) exceeded", extra={"param": "file"}
        )


__all__ = [
    "AudioTooLarge",
    "AudioTooShort",
    "InvalidAudio",
    "InvalidForm",
    "UnsupportedLanguage",
]
