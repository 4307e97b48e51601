"""Errors of the audio API's request form (OpenAI's shapes); what a speech engine
refuses (`InvalidAudio`, `UnsupportedLanguage`) is the speech facet's: adapters/errors.py.

Exception tree::

    QuorumError (faults)
    ├── BadRequest (faults)            400  invalid_request_error
    │   ├── InvalidForm                400  invalid_request: a missing or bad form field (named)
    │   └── AudioTooShort              400  audio_too_short: under 0.1 s (OpenAI's code)
    └── PayloadTooLarge (faults)       413
        └── AudioTooLarge              413  payload_too_large: body over AUDIO_MAX_BYTES

`param` (the form field at fault) rides in the envelope, as OpenAI's errors carry it.
"""

from __future__ import annotations

from faults import BadRequest, PayloadTooLarge

InvalidForm = BadRequest.row(
    "InvalidForm", "invalid_request", extra=("param",), defaults={"param": None}
)
AudioTooShort = BadRequest.row(
    "AudioTooShort", "audio_too_short", extra=("param",), defaults={"param": "file"}
)
AudioTooLarge = PayloadTooLarge.row(
    "AudioTooLarge",
    "payload_too_large",
    None,
    "Maximum content size limit ({limit} bytes) exceeded",
    extra=("param",),
    defaults={"param": "file"},
)
