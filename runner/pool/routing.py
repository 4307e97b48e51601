"""What a request or an unload may do with a model, decided from its slot alone (pure).

The pool calls these with its slots; they raise the error the client gets, or return when
the request may go on (or wait in the queue for the model). Tests call them with slots.
"""

from __future__ import annotations

from collections.abc import Mapping

from runner.errors import BadRequest, ModelNotFound
from runner.pool.errors import (
    SPEECH_PATHS,
    ModelUnavailable,
    WrongEndpoint,
    serves_speech,
)
from runner.pool.slot import ModelSlot, UnloadMode
from runner.pool.states import ModelState
from runner.scheduler.errors import ModelNotLoaded


def check_unloadable(
    slots: Mapping[str, ModelSlot], model: str, mode: UnloadMode, sleep_enabled: bool
) -> None:
    """404 unless `model` has an engine to stop; 400 when it cannot sleep (checked
    before governance spends a token).

    1. Unknown model: 404. 2. `sleep`: a vLLM the runner started, with
    VLLM_ENABLE_SLEEP_MODE (`sleep_enabled`), and ready. 3. `stop`: ready, failed or
    sleeping.
    """
    slot = slots.get(model)  # 1
    if slot is None:
        raise ModelNotFound(f"model {model!r} does not exist on this runner")
    if mode == "sleep":  # 2
        if slot.spec.backend != "vllm" or slot.spec.attached:
            raise BadRequest("mode 'sleep' needs a vLLM model the runner started")
        if not sleep_enabled:
            raise BadRequest("mode 'sleep' needs VLLM_ENABLE_SLEEP_MODE=true")
        stoppable: tuple[ModelState, ...] = (ModelState.READY,)
    else:  # 3
        stoppable = (ModelState.READY, ModelState.FAILED, ModelState.SLEEPING)
    if slot.state not in stoppable or slot.launched is None:
        raise ModelNotLoaded(f"model {model!r} is not loaded ({slot.state.value})")


def route_missing(slots: Mapping[str, ModelSlot], model: str) -> None:
    """A request for a model with no ready engine: raise the right error, or return when
    the request may wait in the queue for it (loading, or autoload)."""
    slot = slots.get(model)
    if slot is None:
        known = ", ".join(sorted(slots)) or "none"
        raise ModelNotFound(f"model {model!r} does not exist on this runner; models: {known}")
    if slot.state is ModelState.LOADING:
        return
    if slot.state is ModelState.FAILED and not slot.spec.autoload:
        raise ModelUnavailable(f"model {model!r} failed: {slot.error or 'unknown reason'}")
    if slot.state in (ModelState.DRAINING, ModelState.STOPPING):
        raise ModelUnavailable(f"model {model!r} is being unloaded")
    if slot.spec.autoload:
        return
    raise ModelNotLoaded(
        f"model {model!r} is not loaded; load it with POST /v1/models/load (governed)"
    )


def check_endpoint(slots: Mapping[str, ModelSlot], model: str, speech: bool) -> None:
    """A model the other request path serves is 400 `unsupported_model` saying where to
    send it, whatever its state (a loaded speech model has no engine on the data path)."""
    slot = slots.get(model)
    if slot is not None and serves_speech(slot.spec) != speech:
        raise WrongEndpoint(
            f"model {model!r} is a speech model: use {SPEECH_PATHS}"
            if not speech
            else f"model {model!r} is not a speech model (backend {slot.spec.backend})"
        )
