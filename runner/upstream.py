"""Engine connections for the data path, and the one place that translates the
engine client's failures into the runner's errors (see runner/errors.py)."""

from __future__ import annotations

from adapters.errors import (
    EngineBadResponse,
    EngineCrashed,
    EngineError,
    EngineTimeout,
    EngineUnavailable,
)
from runner.engine_client import (
    ClientFailure,
    ConnectFailed,
    ConnectionDropped,
    Pool,
    ProtocolFailure,
    ResponseTimeout,
)

__all__ = ["ClientFailure", "Pool", "translate"]


def translate(exc: ClientFailure, model: str, engine_failure: str | None = None) -> EngineError:
    """Map a failure talking to `model`'s engine to a runner error.

    `engine_failure` is the supervisor's account when the engine process died: the
    client then hears that (exit code included), not a bare connection error.
    """
    if engine_failure is not None:
        return EngineCrashed(f"engine for model {model!r} {engine_failure}")
    if isinstance(exc, ResponseTimeout):
        return EngineTimeout(f"engine for model {model!r} did not answer in time")
    if isinstance(exc, ConnectFailed):
        return EngineUnavailable(f"engine for model {model!r} is unreachable")
    if isinstance(exc, ConnectionDropped):
        return EngineUnavailable(f"engine for model {model!r} closed the connection")
    if isinstance(exc, ProtocolFailure):
        return EngineBadResponse(f"engine for model {model!r} sent an invalid HTTP response")
    return EngineUnavailable(f"engine for model {model!r} failed: {exc}")
