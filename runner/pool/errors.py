"""The pool's errors (all reach HTTP through runner/errors.py).

Exception tree::

    RunnerError
    ├── ModelNotFound (runner)       404
    │   └── ModelNotLoaded           404  model_not_loaded: in the catalog, not loaded
    ├── BadRequest (runner)          400
    │   └── WrongEndpoint            400  unsupported_model: a speech model on a chat path,
    │                                      or a chat model on an audio path
    └── ServiceUnavailable (runner)  503
        ├── ModelUnavailable         503  model_unavailable: failed, unloading, cancelled
        └── ModelDoesNotFit          503  model_does_not_fit: no room even after eviction
"""

from __future__ import annotations

from runner.errors import BadRequest, ModelNotFound, ServiceUnavailable
from runner.models_config import ModelSpec


class ModelNotLoaded(ModelNotFound):
    code = "model_not_loaded"


class ModelUnavailable(ServiceUnavailable):
    code = "model_unavailable"


class WrongEndpoint(BadRequest):
    code = "unsupported_model"


# Which request path serves a backend's models (the others answer 400 for them).
SPEECH_BACKENDS = frozenset({"faster-whisper"})
SPEECH_PATHS = "POST /v1/audio/transcriptions or /v1/audio/translations"


def serves_speech(spec: ModelSpec) -> bool:
    return spec.backend in SPEECH_BACKENDS


class ModelDoesNotFit(ServiceUnavailable):
    code = "model_does_not_fit"
