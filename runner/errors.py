"""The runner's own error rows, and the one place any error becomes an HTTP answer.

Every error a client can get is a `faults.QuorumError`: each package declares its rows
in its `errors.py` (this one, `runner/scheduler/errors.py`, `adapters/errors.py`,
`tenants/errors.py`, `governance/errors.py`, ...), and `error_body` / `error_status` /
`error_headers` below turn any of them into the envelope
`{"error": {"code", "message", "type", **extra}}` with its headers. Anything else is an
internal error: 500 with a generic message, logged with its traceback, never shown.

Exception tree (the runner's rows; the generic ones come from `faults`)::

    QuorumError (faults)
    ├── BadRequest (faults)          400  invalid_request
    │   ├── InvalidHeader            400  invalid_header: a request header's value (names it)
    │   ├── InvalidField             400  invalid_request: a body field out of its range
    │   │                                 (names it in `param`; runner/http/body_checks.py)
    │   ├── UnsupportedParameter     400  unsupported_parameter: a body field outside the
    │   │                                 endpoint's canonical request, or a count the
    │   │                                 runner does not serve (`param`; runner/http/canonical.py)
    │   ├── WrongEndpoint            400  unsupported_model: a model another path serves
    │   └── InvalidHost              400  invalid_host: a Host header that names no host in
    │                                     ALLOWED_HOSTS (runner/http/hosts.py)
    ├── Forbidden (faults)           403  forbidden: not for this tenant (engine logs)
    ├── NotFound (faults)            404  not_found
    │   ├── ModelNotFound            404  model_not_found: no such model (lists the models)
    │   └── RouteNotFound            404  not_found: no such endpoint
    ├── MethodNotAllowed             405  method_not_allowed (Allow header)
    ├── MissingOpToken               401  missing_op_token: a lifecycle call without a token
    ├── LoginRequired                401  login_required: the status page asks a browser to sign in
    ├── ModelDownloadFailed          502  model_download_failed: the Hub download failed
    ├── AdapterRefused               409  adapter_refused: an adapter load/unload that
    │                                     cannot run now or here (the message says why)
    ├── HttpError                    4xx  http_error: another refusal of the framework's
    ├── PayloadTooLarge (faults)     413  payload_too_large: body above MAX_BODY_BYTES
    ├── UnsupportedMediaType         415  unsupported_media_type: a JSON path's body not
    │                                     sent as application/json
    ├── LifecycleRateLimited         429  lifecycle_rate_limited: a source's lifecycle calls
    │                                     past LIFECYCLE_RATE_LIMIT (+ Retry-After)
    ├── TooManySourceConnections     429  too_many_source_connections: one address holds
    │                                     MAX_CONNECTIONS_PER_SOURCE (+ Retry-After)
    ├── RequestTimeout               408  request_timeout: headers or body too slow
    │                                     (runner/http/limits.py)
    ├── DeadlineAtEngine             504  deadline_exceeded: X-Request-Deadline-Ms passed
    │                                     after the grant, before the first byte of the
    │                                     answer (runner/http/deadline.py)
    ├── HeadersTooLarge              431  request_header_fields_too_large: MAX_HEADER_BYTES,
    │                                     MAX_HEADERS (runner/http/limits.py)
    ├── ServiceUnavailable (faults)  503  service_unavailable: starting, stopping
    │   └── TooManyConnections       503  too_many_connections: MAX_CONNECTIONS open (+ Retry-After)
    └── ConfigError (faults)              start-up only, never an HTTP response
"""

from __future__ import annotations

import logging

import orjson

from faults import (
    BadRequest,
    ConfigError,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    QuorumError,
    ServiceUnavailable,
)

log = logging.getLogger("quorum.errors")

__all__ = [
    "HTTP_ERRORS",
    "AdapterRefused",
    "BadRequest",
    "ConfigError",
    "Forbidden",
    "HeadersTooLarge",
    "HttpError",
    "InvalidField",
    "InvalidHeader",
    "InvalidHost",
    "LifecycleRateLimited",
    "LoginRequired",
    "MethodNotAllowed",
    "MissingOpToken",
    "ModelDownloadFailed",
    "ModelNotFound",
    "NotFound",
    "PayloadTooLarge",
    "QuorumError",
    "RequestTimeout",
    "RouteNotFound",
    "ServiceUnavailable",
    "TooManyConnections",
    "TooManySourceConnections",
    "UnsupportedMediaType",
    "UnsupportedParameter",
    "WrongEndpoint",
    "error_body",
    "error_headers",
    "error_status",
    "route_error",
]

InvalidHeader = BadRequest.row("InvalidHeader", "invalid_header")
InvalidField = BadRequest.row(
    "InvalidField",
    "invalid_request",
    None,
    "{param} must be {rule}; got {value}",
    extra=("param",),
)
UnsupportedParameter = BadRequest.row(
    "UnsupportedParameter",
    "unsupported_parameter",
    None,
    "{param} {reason}",
    extra=("param",),
)
WrongEndpoint = BadRequest.row(
    "WrongEndpoint",
    "unsupported_model",
    None,
    "model {model!r} is {kind}: use {where}",
    extra=("model",),
)
InvalidHost = BadRequest.row(
    "InvalidHost",
    "invalid_host",
    None,
    "this runner does not answer to that Host name; add it to ALLOWED_HOSTS",
)
ModelNotFound = NotFound.row(
    "ModelNotFound",
    "model_not_found",
    None,
    "Model {model!r} does not exist on this runner; models: {models}",
    extra=("model",),
)
RouteNotFound = NotFound.row("RouteNotFound", "not_found")
AdapterRefused = QuorumError.row("AdapterRefused", "adapter_refused", 409)
MethodNotAllowed = QuorumError.row(
    "MethodNotAllowed",
    "method_not_allowed",
    405,
    "{path} accepts {allow} only",
    headers={"Allow": "{allow}"},
)
HttpError = QuorumError.row("HttpError", "http_error", 400)
LoginRequired = QuorumError.row(
    "LoginRequired",
    "login_required",
    401,
    "the status page is for ADMIN_TENANTS: sign in with the tenant id as user and its API "
    "key as password",
    headers={"WWW-Authenticate": 'Basic realm="quorum status", charset="UTF-8"'},
)
MissingOpToken = QuorumError.row(
    "MissingOpToken",
    "missing_op_token",
    401,
    "a verifiedOpToken (body) or X-Op-Token (header) is required",
)
ModelDownloadFailed = QuorumError.row("ModelDownloadFailed", "model_download_failed", 502)
UnsupportedMediaType = QuorumError.row(
    "UnsupportedMediaType",
    "unsupported_media_type",
    415,
    "send the body as JSON with 'Content-Type: application/json'",
)
LifecycleRateLimited = QuorumError.row(
    "LifecycleRateLimited",
    "lifecycle_rate_limited",
    429,
    "too many lifecycle calls from this address ({rate}); retry in {retry_after} seconds",
    error_type="rate_limit_error",
    retry_after=True,
)
RequestTimeout = QuorumError.row(
    "RequestTimeout", "request_timeout", 408, "the {phase} did not arrive within {timeout} s"
)
DeadlineAtEngine = QuorumError.row(
    "DeadlineAtEngine",
    "deadline_exceeded",
    504,
    "The deadline of {deadlineMs} ms passed after {queueWaitMs} ms in the queue, "
    "before the engine's answer began",
    extra=("queueWaitMs", "deadlineMs"),
)
HeadersTooLarge = QuorumError.row(
    "HeadersTooLarge",
    "request_header_fields_too_large",
    431,
    "request headers are larger than {limit} bytes",
)
TooManyConnections = ServiceUnavailable.row(
    "TooManyConnections",
    "too_many_connections",
    503,
    "{limit} connections are open; retry in {retry_after} s or on another runner",
    retry_after=True,
)

TooManySourceConnections = QuorumError.row(
    "TooManySourceConnections",
    "too_many_source_connections",
    429,
    "{limit} connections are open from your address; close one, then retry in {retry_after} s",
    error_type="rate_limit_error",
    retry_after=True,
)

HTTP_ERRORS: tuple[type[Exception], ...] = (QuorumError,)
"""What request handlers catch to answer in the envelope (everything else is a 500)."""


def route_error(status: int, message: str) -> QuorumError:
    """The framework's refusal (unknown path, wrong method, ...) as one of our rows."""
    if status == 404:
        return RouteNotFound(message)
    if status == 405:
        return MethodNotAllowed(message)
    error = HttpError(message)
    error.status = status  # type: ignore[misc]  # the framework's own 4xx, kept as is
    return error


def error_status(exc: BaseException) -> int:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) and 400 <= status <= 599 else 500


def error_body(exc: BaseException) -> bytes:
    """The OpenAI-shaped envelope for any error; internals never leak."""
    if error_status(exc) == 500 or not isinstance(exc, QuorumError):
        log.error("internal error", exc_info=exc)
        payload: dict[str, object] = {
            "code": "internal_error",
            "message": "internal error",
            "type": "server_error",
        }
    else:
        payload = {"code": exc.code, "message": str(exc), "type": exc.type, **exc.extra}
    return orjson.dumps({"error": payload})


def error_headers(exc: BaseException) -> dict[str, str]:
    return dict(exc.headers) if isinstance(exc, QuorumError) else {}
