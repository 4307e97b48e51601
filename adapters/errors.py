"""Errors of the engine adapters and the supervisor.

Exception tree::

    RunnerError (runner/errors.py)
    ├── EngineCrashed (runner)     502  engine_crashed: the engine process died (exit code)
    ├── EngineStartFailed          503  engine_start_failed: exited while starting, or not
    │                                    healthy within the load timeout (last log lines)
    └── UnsupportedRequest         400  a request field the engine cannot serve safely
    IllegalEngineTransition             a bug: a state change the supervisor forbids

Adapters translate their engines' foreign failures (httpx, OSError) here, once each.
"""

from __future__ import annotations

from runner.errors import BadRequest, RunnerError


class EngineStartFailed(RunnerError):
    status = 503
    code = "engine_start_failed"
    type = "server_error"

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class UnsupportedRequest(BadRequest):
    code = "unsupported_parameter"


class IllegalEngineTransition(RuntimeError):
    """A state change the supervisor's table forbids (always a bug)."""
