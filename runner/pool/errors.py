"""The pool's own refusals (everything about a model's state is the scheduler's:
`runner/scheduler/errors.py`).

Exception tree::

    QuorumError (faults)
    ├── BadRequest (faults)          400
    │   └── WrongEndpoint            400  unsupported_model: a speech model on a chat path,
    │                                      or a chat model on an audio path
    └── ServiceUnavailable (faults)  503
        ├── ModelUnavailable         503  model_unavailable: the pool cannot do it in the
        │                                 model's current state (names the state)
        └── LoadCancelled            503  load_cancelled: the load was cancelled
"""

from __future__ import annotations

from faults import BadRequest, ServiceUnavailable
from runner.models_config import ModelSpec

WrongEndpoint = BadRequest.row("WrongEndpoint", "unsupported_model")
ModelUnavailable = ServiceUnavailable.row("ModelUnavailable", "model_unavailable")
LoadCancelled = ServiceUnavailable.row(
    "LoadCancelled", "load_cancelled", None, "The load of {model!r} was cancelled"
)

# Which request path serves a backend's models (the others answer 400 for them).
SPEECH_BACKENDS = frozenset({"faster-whisper"})
SPEECH_PATHS = "POST /v1/audio/transcriptions or /v1/audio/translations"


def serves_speech(spec: ModelSpec) -> bool:
    return spec.backend in SPEECH_BACKENDS
