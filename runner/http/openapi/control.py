"""The control plane's operations for the runner's OpenAPI document: the governed
lifecycle calls (a signed token or nothing happens), the runner's state and the
operators' status page. Bodies are as strict as the runner's parsers (`runner/lifecycle/loads.py`,
`runner/lifecycle/governed.py`): a field they refuse is not allowed here either.
"""

from __future__ import annotations

from typing import Any

from runner.floor.settings import PICKER_PATH
from runner.http.openapi.components import IDENTITY_PARAMETERS, OP_TOKEN, Schema, header_refs
from runner.http.openapi.paths import (
    JSON,
    OPTIONAL_KEY,
    errors,
    json_answer,
    params,
    path_param,
    ref,
)
from runner.lifecycle.governed import FLUSH_SCOPES
from runner.lifecycle.load_requests import QUANTIZATIONS
from runner.telemetry.metrics import METRICS_PATH


def _governed(summary: str, body: Schema, ok: Schema, *extra: int) -> Schema:
    """A lifecycle operation: a signed token (body or X-Op-Token) or nothing happens."""
    return {
        "post": {
            "summary": summary,
            "tags": ["lifecycle"],
            "parameters": params("X-Op-Token"),
            "requestBody": {"required": True, "content": {JSON: {"schema": body}}},
            "responses": {**ok, **errors(400, 401, 403, 404, 409, 413, 429, *extra, 503)},
        }
    }


def strict_body(required: list[str], properties: Schema) -> Schema:
    return {
        "type": "object",
        "required": required,
        "properties": properties,
        "additionalProperties": False,
    }


MODEL_ID: Schema = {"type": "string", "minLength": 1}
LOAD_BODY = strict_body(
    ["modelId"],
    {
        "modelId": MODEL_ID,
        "quantization": {"type": ["string", "null"], "enum": [*QUANTIZATIONS, None]},
        "maxContextLength": {"type": ["integer", "null"], "minimum": 1, "maximum": 10_000_000},
        "gpuMemoryBudgetMB": {"type": ["integer", "null"], "minimum": 1, "maximum": 100_000_000},
        "evictModel": {"type": ["string", "null"], "minLength": 1},
        "verifiedOpToken": OP_TOKEN,
    },
)
UNLOAD_BODY = strict_body(
    ["modelId"],
    {
        "modelId": MODEL_ID,
        "mode": {"type": "string", "enum": ["stop", "sleep"]},
        "verifiedOpToken": OP_TOKEN,
    },
)
FLUSH_BODY = strict_body(
    ["scope"],
    {
        "scope": {"type": "string", "enum": list(FLUSH_SCOPES)},
        "modelId": {"type": ["string", "null"], "minLength": 1},
        "tenantId": {"type": ["string", "null"], "pattern": "^[A-Za-z0-9._-]{1,64}$"},
        "tag": {"type": ["string", "null"], "minLength": 1, "maxLength": 64},
        "verifiedOpToken": OP_TOKEN,
    },
)
CANCEL_BODY = strict_body([], {"verifiedOpToken": OP_TOKEN})
SHA256: Schema = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
ADAPTER_LOAD_BODY = strict_body(
    ["adapterId", "baseModel", "path", "sha256", "tenants"],
    {
        "adapterId": {"type": "string", "minLength": 1, "maxLength": 256},
        "baseModel": {"type": "string", "minLength": 1, "maxLength": 256},
        "path": {"type": "string", "minLength": 1, "maxLength": 256},
        "sha256": SHA256,
        "tenants": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "string", "minLength": 1, "maxLength": 64},
        },
        "scale": {"type": "number", "exclusiveMinimum": 0, "maximum": 4},
        "verifiedOpToken": OP_TOKEN,
    },
)
ADAPTER_UNLOAD_BODY = strict_body(
    ["adapterId", "baseModel", "sha256"],
    {
        "adapterId": {"type": "string", "minLength": 1, "maxLength": 256},
        "baseModel": {"type": "string", "minLength": 1, "maxLength": 256},
        "sha256": SHA256,
        "verifiedOpToken": OP_TOKEN,
    },
)
ADAPTER_UNLOADED: Schema = {
    "type": "object",
    "required": ["adapterId", "baseModel", "unloaded"],
    "properties": {
        "adapterId": {"type": "string"},
        "baseModel": {"type": "string"},
        "unloaded": {"const": True},
    },
}

ACCEPTED_LOAD: Schema = {
    "type": "object",
    "required": ["taskId", "status", "progress", "eta"],
    "properties": {
        "taskId": {"type": "string"},
        "status": {"type": "string"},
        "progress": {"type": "number"},
        "eta": {"type": ["number", "null"]},
    },
}
UNLOADED: Schema = {
    "type": "object",
    "required": ["modelId", "gpuMemoryFreedMB", "kvCacheFlushed"],
    "properties": {
        "modelId": {"type": "string"},
        "gpuMemoryFreedMB": {"type": "integer"},
        "kvCacheFlushed": {"type": "boolean"},
        "mode": {"const": "sleep"},
    },
}
FLUSHED: Schema = {
    "type": "object",
    "required": ["flushed", "entriesRemoved", "memoryFreedMB"],
    "properties": {
        "flushed": {"type": "boolean"},
        "entriesRemoved": {"type": "integer"},
        "memoryFreedMB": {"type": "number"},
        "reason": {"type": "string"},
    },
}


def lifecycle() -> dict[str, Schema]:
    task_id = path_param("taskId", "The load task's id (`POST /v1/models/load`).")
    cancel_body = {"required": False, "content": {JSON: {"schema": CANCEL_BODY}}}
    return {
        "/v1/models/load": _governed(
            "Load a model (governed: model-load)",
            LOAD_BODY,
            {
                "202": json_answer(
                    ACCEPTED_LOAD,
                    "The load task, under way.",
                    header_refs(("Location",), ("Location",)),
                )
            },
            502,
        ),
        "/v1/models/load/{taskId}": {
            "parameters": [task_id],
            "get": {
                "summary": "A load task's state (no token)",
                "tags": ["lifecycle"],
                "responses": {
                    "200": json_answer(ref("schemas", "LoadTask"), "The task."),
                    **errors(404, 503),
                },
            },
            "delete": {
                "summary": "Cancel a load (governed: task-cancel)",
                "tags": ["lifecycle"],
                "parameters": params("X-Op-Token"),
                "requestBody": cancel_body,
                "responses": {
                    "200": json_answer(ref("schemas", "LoadTask"), "The task, cancelled."),
                    **errors(400, 401, 403, 404, 409, 413, 429, 503),
                },
            },
        },
        "/v1/models/unload": _governed(
            "Unload a model (governed: model-unload)",
            UNLOAD_BODY,
            {"200": json_answer(UNLOADED, "The model is stopped (or asleep).")},
        ),
        "/v1/cache/flush": _governed(
            "Flush the KV cache (governed: cache-flush)",
            FLUSH_BODY,
            {"200": json_answer(FLUSHED, "What was flushed.")},
        ),
        "/v1/adapters/load": _governed(
            "Load a LoRA adapter onto its base model (governed: adapter-load)",
            ADAPTER_LOAD_BODY,
            {"200": json_answer(ref("schemas", "Adapter"), "The adapter, loaded or ready.")},
        ),
        "/v1/adapters/unload": _governed(
            "Unload a LoRA adapter (governed: adapter-unload)",
            ADAPTER_UNLOAD_BODY,
            {"200": json_answer(ADAPTER_UNLOADED, "The adapter is gone.")},
        ),
    }


def get_operation(summary: str, tag: str, responses: Schema, **extra: Any) -> Schema:
    return {"get": {"summary": summary, "tags": [tag], "responses": responses, **extra}}


def _metrics_paths(picker_path: str) -> dict[str, Schema]:
    """`/metrics`, and the endpoint picker's path unless it is merged into `/metrics`."""
    text = {"description": "Prometheus text format.", "content": {"text/plain": {"schema": {}}}}
    merged = ", and the endpoint picker's `vllm:*` family" if picker_path == METRICS_PATH else ""
    out = {
        METRICS_PATH: get_operation(
            "Prometheus metrics: the runner's own and the seed's names" + merged,
            "state",
            {"200": text, **errors(503)},
        )
    }
    if picker_path != METRICS_PATH:
        out[picker_path] = get_operation(
            "The endpoint picker's `vllm:*` metrics (PICKER_METRICS_PATH)",
            "state",
            {"200": text, **errors(503)},
        )
    return out


def runner_state(picker_path: str = PICKER_PATH) -> dict[str, Schema]:
    health = ref("schemas", "Health")
    models: Schema = {
        "type": "object",
        "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array"}},
    }
    logs: Schema = {
        "type": "object",
        "required": ["modelId", "lines"],
        "properties": {
            "modelId": {"type": "string"},
            "lines": {"type": "array", "items": {"type": "string"}},
        },
    }
    caps = ref("schemas", "Capabilities")
    cache = header_refs(("Cache-Control",), ("Cache-Control",))
    retry = header_refs(("Retry-After",))  # while starting: the preloads' time left
    admin = {"security": OPTIONAL_KEY, "parameters": params(*IDENTITY_PARAMETERS)}
    return {
        "/health": get_operation(
            "Readiness: able to serve",
            "state",
            {
                "200": json_answer(health, "Healthy."),
                "503": json_answer(health, "Not ready (status says why).", retry),
            },
        ),
        "/health/live": get_operation(
            "Liveness: the process answers",
            "state",
            {"200": json_answer({"type": "object", "required": ["status"]}, "Alive.")},
        ),
        "/v1/capabilities": get_operation(
            "What this runner can do and how full it is",
            "state",
            {
                "200": json_answer(caps, "The seed's document.", cache),
                "503": json_answer(caps, "Starting or stopping.", {**cache, **retry}),
                **errors(400, 401, 403, 429),
            },
            parameters=params(*IDENTITY_PARAMETERS),
        ),
        **_metrics_paths(picker_path),
        "/v1/models": get_operation(
            "The models ready to serve (a tenant that names itself: those it may use)",
            "state",
            {"200": json_answer(models, "Models."), **errors(400, 401, 403, 429)},
            security=OPTIONAL_KEY,
            parameters=params(*IDENTITY_PARAMETERS),
        ),
        "/v1/models/{modelId}/logs": {
            "parameters": [path_param("modelId", "A model of this runner.")],
            **get_operation(
                "An engine's last output lines (ADMIN_TENANTS)",
                "state",
                {"200": json_answer(logs, "The lines."), **errors(400, 401, 403, 404, 429)},
                **admin,
            ),
        },
        "/openapi.json": get_operation(
            "This document",
            "state",
            {
                "200": json_answer(
                    {"type": "object", "required": ["openapi", "paths"]}, "OpenAPI 3.1."
                )
            },
        ),
    }


def status_page() -> dict[str, Schema]:
    def page(media: str, description: str) -> Schema:
        return {"description": description, "content": {media: {"schema": {}}}}

    admin = {
        "security": [{}, {"apiKey": []}, {"basic": []}],
        "parameters": params(*IDENTITY_PARAMETERS),
    }
    refused = errors(400, 401, 403, 429)
    state = {"type": "object"}
    return {
        "/ui": get_operation(
            "The operators' status page (ADMIN_TENANTS)",
            "ui",
            {"200": page("text/html", "The page."), **refused},
            **admin,
        ),
        "/ui/state.json": get_operation(
            "The state the status page shows",
            "ui",
            {"200": json_answer(state, "The page's state."), **refused},
            **admin,
        ),
        "/ui/{name}": {
            "parameters": [path_param("name", "`app.js` or `style.css`.")],
            **get_operation(
                "The status page's script and style sheet",
                "ui",
                {
                    "200": {
                        "description": "The file.",
                        "content": {"text/javascript": {"schema": {}}, "text/css": {"schema": {}}},
                    },
                    **refused,
                    **errors(404),
                },
                **admin,
            ),
        },
    }
