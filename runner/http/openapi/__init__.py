"""The runner's HTTP contract as an OpenAPI 3.1 document, served at `GET /openapi.json`.

Written by hand rather than generated: the data path (chat, audio, images) is bare ASGI
that no framework sees, and the control plane's FastAPI routes read their bodies raw, so a
generator would describe neither truthfully. What can be read from the code is read from
it: the error codes per status from every package's error table (`components.error_codes`),
the enumerations (quantizations, flush scopes, response formats) from the modules that
check them, and the models in the examples from this runner's models file.
`tests/runner/http/test_openapi.py` runs schemathesis over the served document against a real
runner: no 5xx, every status and body as documented.

    paths.py        the data path (chat, audio, images) and jobs, and shared helpers
    control.py      the lifecycle calls, the runner's state, the status page
    tenants.py      /v1/tenants and /v1/usage (issue 26)
    components.py   the error envelope, headers, shared bodies
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from runner import __version__
from runner.floor.settings import PICKER_PATH
from runner.http.openapi.components import (
    ANY_PATH_STATUSES,
    DATA_PATH_HEADERS,
    ERROR_STATUSES,
    HEADERS,
    PARAMETERS,
    SCHEMAS,
    Schema,
    error_codes,
    error_schema,
    header_refs,
)
from runner.http.openapi.control import lifecycle, runner_state, status_page
from runner.http.openapi.paths import data_path, jobs
from runner.http.openapi.tenants import tenants

OPENAPI_PATH = "/openapi.json"

_ERROR_HEADERS = {
    401: ("WWW-Authenticate",),
    405: ("Allow",),
    429: (
        "Retry-After",
        "RateLimit-Limit",
        "RateLimit-Remaining",
        "RateLimit-Reset",
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
    ),
    503: ("Retry-After",),
}
_ERROR_WHEN = {
    400: "A bad request: header, body or field (`param` or the message names it).",
    401: "No or a bad API key, governance token or login; gateway mode: no gateway identity.",
    403: "Not for this tenant (a model outside its `models`), not from the runner's gateway, "
    "or the token's signers may not do this.",
    404: "No such model, task, job, image or path.",
    405: "Another method than the path takes (`Allow`).",
    408: "The request's headers or body did not arrive in time.",
    409: "A replayed governance token, or a task that cannot be cancelled any more.",
    413: "A body (or token) above its limit.",
    415: "A JSON path's body not sent as `Content-Type: application/json`.",
    429: "The tenant is over its rate limit, a token budget or its live jobs, or the source "
    "failed to authenticate (or called lifecycle routes) too often lately (`Retry-After`).",
    431: "Request headers too large, or too many of them.",
    502: "The engine failed under the request.",
    503: "The runner, the model, the queue or a store cannot take it now (`Retry-After` "
    "where a wait helps).",
    504: "The engine was silent for ENGINE_READ_TIMEOUT_S.",
}

_ANY_PATH = {s: {"$ref": f"#/components/responses/E{s}"} for s in ANY_PATH_STATUSES}

ADAPTER: Schema = {
    "type": "object",
    "required": ["id", "baseModel", "state", "rank", "memoryMB", "requests"],
    "properties": {
        "id": {"type": "string"},
        "baseModel": {"type": "string"},
        "state": {"enum": ["loaded", "available", "adding", "removing", "failed"]},
        "rank": {"type": ["integer", "null"]},
        "memoryMB": {"type": "number"},
        "sha256": {"type": ["string", "null"]},
        "governed": {"type": "boolean"},
        "error": {"type": ["string", "null"]},
        "loadTimeMs": {"type": "integer"},
        "requests": {
            "type": "object",
            "required": ["running", "waiting"],
            "properties": {"running": {"type": "integer"}, "waiting": {"type": "integer"}},
        },
    },
}
"""A LoRA adapter as capabilities and an adapter load list it (runner/lifecycle/adapter_ops.py)."""

CAPABILITIES: Schema = {
    "type": "object",
    "required": [
        "runnerType",
        "runnerId",
        "models",
        "resources",
        "queue",
        "capabilities",
        "health",
    ],
    "properties": {
        "runnerType": {"type": "string"},
        "runnerId": {"type": "string"},
        "models": {
            "type": "object",
            "required": ["loaded", "loading", "available"],
            "properties": {
                "loaded": {"type": "array", "items": {"type": "object", "required": ["id"]}},
                "loading": {"type": "array", "items": {"type": "object", "required": ["id"]}},
                "available": {"type": "array", "items": {"type": "string"}},
                "failed": {"type": "array", "items": {"type": "object", "required": ["id"]}},
            },
        },
        "resources": {
            "type": "object",
            "required": ["gpuIds", "gpuMemoryTotalMB", "gpuMemoryUsedMB", "gpuMemoryFreeMB"],
            "properties": {"gpuIds": {"type": "array", "items": {"type": "integer"}}},
        },
        "queue": {
            "type": "object",
            "required": ["depth", "maxDepth", "avgWaitMs", "p95WaitMs"],
        },
        "capabilities": {
            "type": "object",
            "additionalProperties": {"type": "boolean"},
        },
        "health": {"type": "string"},
        "adapters": {"type": "array", "items": ADAPTER},
    },
}


def _error_responses() -> dict[str, Schema]:
    """`E<status>`: the envelope; `D<status>`: the same on the data path, with its headers
    (an engine's own refusal too: `adapters/refusals.py`)."""
    out: dict[str, Schema] = {}
    for status in ERROR_STATUSES:
        content = {"application/json": {"schema": {"$ref": f"#/components/schemas/Error{status}"}}}
        own = _ERROR_HEADERS.get(status, ())
        required = ("Allow", "WWW-Authenticate") if status in (401, 405) else ()
        if status == 401:  # the status page's and API keys' challenges; tokens have none
            required = ()
        described = {"description": _ERROR_WHEN[status], "content": content}
        out[f"E{status}"] = {**described, "headers": header_refs(own, required)}
        data = (*DATA_PATH_HEADERS, "X-GPU-Time-Ms", *own)
        limits = (
            "RateLimit-Limit",
            "RateLimit-Remaining",
            "RateLimit-Reset",
            "X-Effective-Priority",
        )
        data += tuple(h for h in limits if h not in data)
        out[f"D{status}"] = {
            **described,
            "headers": header_refs(data, (*DATA_PATH_HEADERS, "X-GPU-Time-Ms", *required)),
        }
    return out


def openapi_document(models: Sequence[str] = (), picker_path: str = PICKER_PATH) -> Schema:
    """The whole document; `models` are this runner's (the body examples name them),
    `picker_path` its PICKER_METRICS_PATH."""
    codes = error_codes()
    schemas: dict[str, Schema] = {
        **SCHEMAS,
        "Capabilities": CAPABILITIES,
        "Adapter": ADAPTER,
        **{f"Error{s}": error_schema(s, codes[s]) for s in ERROR_STATUSES},
    }
    paths = {
        **data_path(models),
        **jobs(),
        **lifecycle(),
        **runner_state(picker_path),
        **status_page(),
        **tenants(),
    }
    for item in paths.values():  # the connection's limits, before any path is reached
        for method, operation in item.items():
            if method != "parameters":
                for status in ANY_PATH_STATUSES:
                    operation["responses"].setdefault(str(status), _ANY_PATH[status])
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Quorum runner",
            "version": __version__,
            "description": "A governed multi-tenant model runner: OpenAI-compatible inference, "
            "M-of-N signed lifecycle operations, fair per-tenant scheduling. Every error "
            'answers `{"error": {"code", "message", "type", ...}}`. See docs/api.md.',
        },
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "responses": _error_responses(),
            "parameters": PARAMETERS,
            "headers": HEADERS,
            "securitySchemes": {
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A tenant's API key, where keys are configured "
                    "(docs/tenants.md).",
                },
                "basic": {
                    "type": "http",
                    "scheme": "basic",
                    "description": "The status page: the tenant id as user, its API key as "
                    "password.",
                },
            },
        },
    }


def openapi_json(models: Sequence[str] = (), picker_path: str = PICKER_PATH) -> bytes:
    return orjson.dumps(openapi_document(models, picker_path))
