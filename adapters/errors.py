"""Errors of the engine adapters and the supervisor.

Exception tree::

    RunnerError (runner/errors.py)
    ├── EngineCrashed (runner)     502  engine_crashed: the engine process died (exit code)
    ├── EngineStartFailed          503  engine_start_failed: exited while starting, or not
    │   │                                healthy within the load timeout (last log lines)
    │   └── EngineOutOfMemory      503  engine_out_of_memory: the engine ran out of GPU
    │                                    memory while starting (its own words first)
    ├── EngineControlFailed        502  engine_control_failed: a control call (sleep,
    │                                    wake up, cache reset) failed or was refused
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


class EngineOutOfMemory(EngineStartFailed):
    """The engine could not get the GPU memory it was started with (CUDA OOM, too little
    free memory for `--gpu-memory-utilization`, or no room left for the KV cache)."""

    code = "engine_out_of_memory"


class EngineControlFailed(RunnerError):
    """A control call to a running engine (sleep, wake up, reset its cache) failed."""

    status = 502
    code = "engine_control_failed"
    type = "server_error"
