"""The reusable parts of the runner's OpenAPI document: the error envelope (its codes read
from the error tables, so the contract cannot name a code the runner does not have, nor
miss one it has), the request and response headers, and the bodies several paths share.

Everything here is plain data (JSON Schema 2020-12, as OpenAPI 3.1 takes it); the
operations that use it are in `runner/http/openapi/paths.py`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

from faults import QuorumError
from runner.engines.kinds import EngineKinds

Schema = dict[str, Any]

ERROR_MODULES = (
    "runner.errors",
    "runner.http.audio.errors",
    "runner.jobs.errors",
    "runner.tasks.errors",
    "runner.scheduler.errors",
    "runner.memory.errors",
    "adapters.errors",
    "tenants.errors",
    "governance.errors",
)
"""Every package's error table (`errors.py`): the rows a client can be answered with; and
each built-in engine kind's own (`Traits.error_tables`, `error_modules`)."""

ERROR_STATUSES = (400, 401, 403, 404, 405, 408, 409, 413, 415, 429, 431, 502, 503, 504)
"""The statuses the runner answers in its envelope (500 is never documented: a bug; 499 is
the metrics' label for a client gone, never sent). Every row's status must be one of these
(tests/runner/http/test_openapi.py)."""

ANY_PATH_STATUSES = (408, 431)
"""What any request may meet before it reaches a path: headers or body too slow (408),
headers too large or too many (431), runner/http/limits.py."""


def error_rows(cls: type[QuorumError]) -> Iterator[type[QuorumError]]:
    yield cls
    for sub in cls.__subclasses__():
        yield from error_rows(sub)


def error_modules() -> tuple[str, ...]:
    """The runner's packages' error tables, then the kinds' own (`Traits.error_tables`)."""
    kinds = tuple(m for kind in EngineKinds() for m in kind.traits.error_tables)
    return ERROR_MODULES + tuple(m for m in dict.fromkeys(kinds) if m not in ERROR_MODULES)


def error_codes() -> dict[int, list[str]]:
    """The envelope's `code`s by HTTP status, read from every error table.

    `http_error` (a framework refusal kept with its own 4xx, `runner.errors.route_error`)
    may come with any 4xx status, so it is listed under each.
    """
    for module in error_modules():
        importlib.import_module(module)
    codes: dict[int, set[str]] = {status: set() for status in ERROR_STATUSES}
    for row in error_rows(QuorumError):
        if row.status in codes:
            codes[row.status].add(row.code)
    for status, found in codes.items():
        if status < 500:
            found.add("http_error")
    return {status: sorted(found) for status, found in codes.items()}


def error_schema(status: int, codes: list[str]) -> Schema:
    """The envelope `{"error": {"code", "message", "type", ...}}` for one status."""
    kinds = {
        400: ["invalid_request_error"],
        401: ["authentication_error"],
        403: ["permission_error"],
        429: ["rate_limit_error"],
    }.get(status, ["invalid_request_error"] if status < 500 else ["server_error"])
    return {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message", "type"],
                "properties": {
                    "code": {"type": "string", "enum": codes},
                    "message": {"type": "string"},
                    "type": {"type": "string", "enum": kinds},
                    "param": {"type": ["string", "null"]},
                    "model": {"type": "string"},
                    "reason": {"type": ["string", "null"]},
                    "limit": {"type": "integer"},
                    "remaining": {"type": "integer"},
                    "resetAt": {"type": "integer"},
                    "queueDepth": {"type": "integer"},
                    "avgWaitMs": {"type": "number"},
                    "taskId": {"type": "string"},
                },
                "additionalProperties": True,
            }
        },
        "additionalProperties": False,
    }


def _int_header(description: str) -> Schema:
    return {"description": description, "schema": {"type": "string", "pattern": "^[0-9]+$"}}


HEADERS: dict[str, Schema] = {
    "X-Request-Id": {
        "description": "The request's id: the client's X-Request-Id, or one the runner made.",
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
    },
    "X-Cache-Hit": {
        "description": "Whether the engine's prefix cache served part of the prompt.",
        "schema": {"type": "string", "enum": ["true", "false"]},
    },
    "X-Cache-Tokens-Reused": _int_header("Prompt tokens served from the engine's cache."),
    "X-Queue-Wait-Ms": _int_header("Time the request waited in the runner's queue."),
    "X-GPU-Time-Ms": _int_header("The engine's time on the request (0: not reported)."),
    "RateLimit-Limit": _int_header("The tenant's requests per window (when it has a limit)."),
    "RateLimit-Remaining": _int_header("Requests left in the window."),
    "RateLimit-Reset": _int_header("Seconds until the window resets."),
    "Retry-After": _int_header("Seconds to wait before trying again."),
    "X-Effective-Priority": {
        "description": "The priority the request was served at: the tenant's default without "
        "X-Priority, capped at the tenant's max (docs/tenants.md).",
        "schema": {"type": "string", "enum": ["high", "normal", "low"]},
    },
    "x-ratelimit-limit-tokens": _int_header("The tightest token budget that applies (tokens)."),
    "x-ratelimit-remaining-tokens": _int_header(
        "Tokens left in that budget's window: its limit less what settled requests were "
        "charged and what requests in flight (this one included) reserved (docs/tenants.md)."
    ),
    "X-Budget-Wait-Ms": _int_header(
        "Time the request waited in line for other requests' token reservations to settle "
        "(only after such a wait; docs/tenants.md, waiting vs refusal)."
    ),
    "x-ratelimit-reset-tokens": {
        "description": "Until that window resets, as OpenAI writes it (`1m30s`).",
        "schema": {"type": "string"},
    },
    "x-ratelimit-limit-requests": _int_header("The tenant's requests per window."),
    "x-ratelimit-remaining-requests": _int_header("Requests left in the window."),
    "x-ratelimit-reset-requests": {
        "description": "Until one more request fits, as OpenAI writes it (`2s`).",
        "schema": {"type": "string"},
    },
    "Location": {"description": "Where to poll the task or job.", "schema": {"type": "string"}},
    "Preference-Applied": {
        "description": "`respond-async`: the request was taken as a job.",
        "schema": {"type": "string", "enum": ["respond-async"]},
    },
    "Allow": {"description": "The methods the path accepts.", "schema": {"type": "string"}},
    "WWW-Authenticate": {
        "description": "The authentication scheme to use.",
        "schema": {"type": "string"},
    },
    "Cache-Control": {"description": "Caching of the answer.", "schema": {"type": "string"}},
}

DATA_PATH_HEADERS = ("X-Request-Id", "X-Cache-Hit", "X-Cache-Tokens-Reused", "X-Queue-Wait-Ms")
"""On every answer of the data path (chat, audio, images), errors included."""


def header_refs(names: tuple[str, ...], required: tuple[str, ...] = ()) -> dict[str, Schema]:
    """Response headers by reference; those in `required` are on every such answer."""
    out: dict[str, Schema] = {}
    for name in names:
        ref = {"$ref": f"#/components/headers/{name}"}
        out[name] = {**ref, "required": True} if name in required else ref
    return out


def _header_param(name: str, schema: Schema, description: str) -> Schema:
    return {
        "name": name,
        "in": "header",
        "required": False,
        "description": description,
        "schema": schema,
    }


PARAMETERS: dict[str, Schema] = {
    "X-Tenant-ID": _header_param(
        "X-Tenant-ID",
        {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$"},
        "The tenant in open mode (TENANT_IDENTITY=open); in keys and gateway mode it names "
        "no one: it must match the key's (or the gateway's) tenant, else 403.",
    ),
    "X-Priority": _header_param(
        "X-Priority", {"type": "string", "enum": ["high", "normal", "low"]}, "Queue priority."
    ),
    "X-Cache-Mode": _header_param(
        "X-Cache-Mode",
        {"type": "string", "enum": ["prefix", "none", "auto"]},
        "Prefix caching: `none` asks the engine not to reuse or keep the prompt.",
    ),
    "X-Cache-Tag": _header_param(
        "X-Cache-Tag",
        {"type": "string", "pattern": "^[!-~]([ -~]{0,62}[!-~])?$"},
        "Scopes cache entries (1-64 characters): requests with one tag share a slot.",
    ),
    "X-Request-Id": _header_param(
        "X-Request-Id",
        {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
        "The request's id, echoed back (generated when absent).",
    ),
    "x-llm-d-inference-fairness-id": _header_param(
        "x-llm-d-inference-fairness-id",
        {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$"},
        "The gateway's fairness id: the tenant in gateway mode (TENANT_IDENTITY=gateway); "
        "in open mode where X-Tenant-ID is absent.",
    ),
    "x-llm-d-inference-objective": _header_param(
        "x-llm-d-inference-objective",
        {"type": "string"},
        "An InferenceObjective's name: the priority where X-Priority is absent, mapped by "
        "OBJECTIVE_PRIORITIES (an unknown name reads `normal`).",
    ),
    "x-gateway-inference-objective": _header_param(
        "x-gateway-inference-objective",
        {"type": "string"},
        "The objective's older name (the newer one wins).",
    ),
    "X-Request-Deadline-Ms": _header_param(
        "X-Request-Deadline-Ms",
        {"type": "string", "pattern": "^[1-9][0-9]{0,6}$"},
        "Milliseconds the client waits for the first byte, 1-3600000: the queue wait is budgeted "
        "against it (503 deadline_unreachable, 504 deadline_exceeded).",
    ),
    "x-llm-d-slo-ttft-ms": _header_param(
        "x-llm-d-slo-ttft-ms",
        {"type": "string"},
        "llm-d's TTFT objective: read as X-Request-Deadline-Ms (and checked as it, else "
        "400) only where that is absent.",
    ),
    "Prefer": _header_param(
        "Prefer",
        {"type": "string", "examples": ["respond-async"]},
        "`respond-async`: answer 202 with a job at once; other preferences are ignored (RFC 7240).",
    ),
    "X-Quorum-Gateway-Secret": _header_param(
        "X-Quorum-Gateway-Secret",
        {"type": "string"},
        "Gateway mode with GATEWAY_SECRET: the gateway's shared secret (else 403 "
        "untrusted_gateway).",
    ),
    "X-Op-Token": _header_param(
        "X-Op-Token",
        {"type": "string"},
        "The governance token, when the body carries no `verifiedOpToken`.",
    ),
}

DATA_PATH_PARAMETERS = (
    "X-Tenant-ID",
    "X-Priority",
    "X-Cache-Mode",
    "X-Cache-Tag",
    "X-Request-Id",
    "x-llm-d-inference-fairness-id",
    "x-llm-d-inference-objective",
    "x-gateway-inference-objective",
    "X-Request-Deadline-Ms",
    "x-llm-d-slo-ttft-ms",
    "X-Quorum-Gateway-Secret",
)
"""The request headers every inference path reads (the gateway's where ours are absent)."""

OP_TOKEN: Schema = {
    "description": "The M-of-N signed governance token ([governance.md]): a JSON object "
    "(or its compact string form).",
    "type": ["object", "string"],
}

SCHEMAS: dict[str, Schema] = {
    "Job": {
        "type": "object",
        "required": ["object", "id", "kind", "model", "status", "created_at"],
        "properties": {
            "object": {"const": "job"},
            "id": {"type": "string"},
            "kind": {
                "type": "string",
                "enum": ["transcription", "translation", "image_generation"],
            },
            "model": {"type": "string"},
            "status": {
                "type": "string",
                "enum": ["queued", "running", "succeeded", "failed", "cancelled"],
            },
            "progress": {
                "type": ["object", "null"],
                "properties": {
                    "done": {"type": "number"},
                    "total": {"type": ["number", "null"]},
                    "fraction": {"type": ["number", "null"]},
                },
            },
            "created_at": {"type": "integer"},
            "started_at": {"type": ["integer", "null"]},
            "finished_at": {"type": ["integer", "null"]},
            "result": {},
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
            },
            "webhook": {
                "type": "object",
                "properties": {"url": {"type": "string"}, "deliveries": {"type": "array"}},
            },
        },
    },
    "LoadTask": {
        "type": "object",
        "required": ["taskId", "status", "progress", "eta", "modelId"],
        "properties": {
            "taskId": {"type": "string"},
            "status": {
                "type": "string",
                "enum": ["queued", "downloading", "loading", "completed", "failed", "cancelled"],
            },
            "progress": {"type": "number", "minimum": 0, "maximum": 1},
            "eta": {"type": ["number", "null"]},
            "modelId": {"type": "string"},
            "gpuMemoryUsedMB": {"type": ["integer", "null"]},
            "loadTimeMs": {"type": ["integer", "null"]},
            "error": {"type": "string"},
        },
    },
    "Health": {
        "type": "object",
        "required": ["status", "uptime", "modelsLoaded", "queueDepth"],
        "properties": {
            "status": {
                "type": "string",
                "enum": [
                    "healthy",
                    "starting",
                    "shutting_down",
                    "unhealthy",
                    "gpu_out_of_memory",
                    "saturated",
                ],
            },
            "uptime": {"type": "integer", "minimum": 0},
            "modelsLoaded": {"type": "integer", "minimum": 0},
            "queueDepth": {"type": "integer", "minimum": 0},
        },
    },
}

IDENTITY_PARAMETERS = ("X-Tenant-ID", "x-llm-d-inference-fairness-id", "X-Quorum-Gateway-Secret")
"""What identifies a request beside an API key (tenants/identity.py), on every path that asks."""
