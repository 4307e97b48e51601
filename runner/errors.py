"""The runner's errors and the one place that maps any error to an HTTP response.

Exception tree (runner side)::

    RunnerError                       status, code, type, extra, headers
    ├── BadRequest             400    invalid_request_error
    │   └── InvalidHeader      400    a request header has a bad value (names it)
    ├── Forbidden              403    not allowed for this tenant (engine logs)
    ├── ModelNotFound          404    unknown or not loaded model (lists loaded ones)
    ├── PayloadTooLarge        413    body above MAX_BODY_BYTES
    ├── EngineError            502    the engine failed
    │   ├── EngineUnavailable  502    connection refused / reset before a response
    │   ├── EngineBadResponse  502    the engine answered something that is not HTTP/JSON
    │   ├── EngineCrashed      502    the engine process died (exit code / signal)
    │   └── EngineTimeout      504    no answer within ENGINE_READ_TIMEOUT_S
    ├── RouteError         404/405    no such endpoint or method
    ├── ServiceUnavailable     503    runner starting or shutting down
    ├── SchedulerError         503    queue full, queue timeout, ... (runner/scheduler/errors.py)
    └── ConfigError                   start-up only, never an HTTP response

The other packages (governance, tenants) raise their own trees with
the same attributes (`status`, `code`, `type`, `extra`, `headers`);
`error_body` and `error_status` accept any of them, and `HTTP_ERRORS` is the
tuple of their roots that request handlers catch. Anything else is an
internal error: 500 with a generic message, logged with its traceback, never
shown to the client.
"""

from __future__ import annotations

import logging
from typing import ClassVar

import orjson

log = logging.getLogger("quorum.errors")


class RunnerError(Exception):
    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"
    type: ClassVar[str] = "server_error"

    def __init__(
        self,
        message: str,
        *,
        extra: dict[str, object] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.extra: dict[str, object] = extra or {}
        self.headers: dict[str, str] = headers or {}


class ConfigError(RunnerError):
    """Invalid configuration found at start-up; the message names the setting."""

    code = "invalid_configuration"


class BadRequest(RunnerError):
    status = 400
    code = "invalid_request"
    type = "invalid_request_error"


class InvalidHeader(BadRequest):
    code = "invalid_header"


class Forbidden(RunnerError):
    status = 403
    code = "forbidden"
    type = "permission_error"


class ModelNotFound(RunnerError):
    status = 404
    code = "model_not_found"
    type = "invalid_request_error"


class PayloadTooLarge(RunnerError):
    status = 413
    code = "payload_too_large"
    type = "invalid_request_error"


class EngineError(RunnerError):
    status = 502
    code = "engine_error"
    type = "server_error"


class EngineUnavailable(EngineError):
    code = "engine_unavailable"


class EngineBadResponse(EngineError):
    code = "engine_bad_response"


class EngineCrashed(EngineError):
    """The engine process died (the supervisor says how: exit code, signal)."""

    code = "engine_crashed"


class EngineTimeout(EngineError):
    status = 504
    code = "engine_timeout"


class RouteError(RunnerError):
    """No such endpoint (404) or method (405): the framework's refusal, in our envelope."""

    type = "invalid_request_error"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status  # type: ignore[misc]
        self.code = {404: "not_found", 405: "method_not_allowed"}.get(status, "http_error")  # type: ignore[misc]


class ServiceUnavailable(RunnerError):
    status = 503
    code = "service_unavailable"


def _http_errors() -> tuple[type[Exception], ...]:
    from governance.errors import GovernanceError
    from tenants.errors import TenantError

    return (RunnerError, TenantError, GovernanceError)


HTTP_ERRORS: tuple[type[Exception], ...] = ()  # filled below, after RunnerError exists


def error_status(exc: BaseException) -> int:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) and 400 <= status <= 599 else 500


def error_body(exc: BaseException) -> bytes:
    """The OpenAI-shaped envelope for any error; internals never leak."""
    status = error_status(exc)
    if status == 500 or not hasattr(exc, "code"):
        log.error("internal error", exc_info=exc)
        payload: dict[str, object] = {
            "code": "internal_error",
            "message": "internal error",
            "type": "server_error",
        }
    else:
        payload = {"code": exc.code, "message": str(exc), "type": getattr(exc, "type", "error")}
        extra = getattr(exc, "extra", None)
        if extra:
            payload.update(extra)
    return orjson.dumps({"error": payload})


def error_headers(exc: BaseException) -> dict[str, str]:
    headers = getattr(exc, "headers", None)
    return dict(headers) if isinstance(headers, dict) else {}


HTTP_ERRORS = _http_errors()
