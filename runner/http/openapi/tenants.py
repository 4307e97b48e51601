"""The OpenAPI paths of tenant policy (issue 26): `/v1/tenants` (governed policy changes,
the admins' list) and `/v1/usage` (billable usage)."""

from __future__ import annotations

from runner.http.openapi.components import IDENTITY_PARAMETERS, OP_TOKEN, Schema
from runner.http.openapi.control import get_operation, strict_body
from runner.http.openapi.paths import (
    JSON,
    OPTIONAL_KEY,
    errors,
    json_answer,
    params,
    path_param,
)

POLICY: Schema = {
    "type": "object",
    "description": "A tenant's policy: the tenants file's schema for one tenant "
    "(docs/tenants.md); API keys as `sha256:<64 hex>` only.",
    "additionalProperties": False,
    "properties": {
        "rate_limit": {"type": "string"},
        "weight": {"type": "number", "exclusiveMinimum": 0},
        "max_queued": {"type": "integer", "minimum": 1},
        "api_keys": {
            "type": "array",
            "items": {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"},
        },
        "models": {"type": "array", "items": {"type": "string"}},
        "priority": {"type": "object"},
        "max_in_flight": {"type": "integer", "minimum": 1},
        "token_budgets": {"type": "array", "items": {"type": "object"}},
    },
}
CHANGED = json_answer(
    strict_body(
        ["tenantId", "version", "policySha256", "approvedBy", "deleted"],
        {
            "tenantId": {"type": "string"},
            "version": {"type": "integer"},
            "policySha256": {"type": "string"},
            "approvedBy": {"type": "array", "items": {"type": "string"}},
            "deleted": {"type": "boolean"},
        },
    ),
    "Applied: every replica serves it within a second.",
)


_COUNT = {"type": "integer", "minimum": 0}
_SECONDS = {"type": "number", "minimum": 0}
USAGE: Schema = {
    "type": "object",
    "required": ["object", "groupBy", "data"],
    "properties": {
        "object": {"const": "list"},
        "groupBy": {"enum": ["hour", "day"]},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "required": [
                    "tenant",
                    "model",
                    "start",
                    "requests",
                    "requestsByOutcome",
                    "promptTokens",
                    "completionTokens",
                    "cachedTokens",
                    "engineSeconds",
                    "queueSeconds",
                    "images",
                    "audioSeconds",
                ],
                "properties": {
                    "tenant": {"type": "string"},
                    "model": {"type": "string"},
                    "start": {"type": "string", "description": "The hour or day, RFC 3339 UTC."},
                    "requests": _COUNT,
                    "requestsByOutcome": {
                        "type": "object",
                        "required": ["ok", "cancelled", "refused", "failed"],
                        "additionalProperties": _COUNT,
                    },
                    "promptTokens": _COUNT,
                    "completionTokens": _COUNT,
                    "cachedTokens": _COUNT,
                    "engineSeconds": _SECONDS,
                    "queueSeconds": _SECONDS,
                    "images": _COUNT,
                    "audioSeconds": _SECONDS,
                },
            },
        },
    },
}
TENANT_LIST: Schema = {
    "type": "object",
    "required": ["version", "tenants"],
    "properties": {
        "version": _COUNT,
        "tenants": {
            "type": "array",
            "items": {
                "type": "object",
                "required": [
                    "tenantId",
                    "source",
                    "version",
                    "policySha256",
                    "approvedBy",
                    "policy",
                ],
                "properties": {
                    "tenantId": {"type": "string"},
                    "source": {"enum": ["file", "api"]},
                    "version": _COUNT,
                    "policySha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                    "approvedBy": {"type": "array", "items": {"type": "string"}},
                    "updatedAt": {"type": ["number", "null"]},
                    "policy": {
                        "type": ["object", "null"],
                        "description": "null: deleted by a governed DELETE",
                    },
                },
            },
        },
    },
}


def tenants() -> dict[str, Schema]:
    """`/v1/tenants` (governed policy changes, the admins' list) and `/v1/usage`."""
    tenant = path_param("tenantId", "A tenant id: 1-64 of `[A-Za-z0-9._-]`.")
    governed = errors(400, 401, 403, 404, 409, 413, 429, 503)
    who = {"security": OPTIONAL_KEY, "parameters": params(*IDENTITY_PARAMETERS)}
    query = [
        {"name": n, "in": "query", "required": False, "schema": {"type": "string"}}
        for n in ("from", "to", "tenant", "model")
    ] + [
        {
            "name": "group_by",
            "in": "query",
            "required": False,
            "schema": {"type": "string", "enum": ["hour", "day"]},
        },
    ]
    return {
        "/v1/tenants": get_operation(
            "Every tenant policy, its source, version and approvers (ADMIN_TENANTS)",
            "tenants",
            {"200": json_answer(TENANT_LIST, "The policies."), **errors(400, 401, 403, 429)},
            **who,
        ),
        "/v1/tenants/{tenantId}": {
            "parameters": [tenant],
            "put": {
                "summary": "Set a tenant's policy (governed: operation tenant-policy)",
                "tags": ["tenants"],
                "parameters": params("X-Op-Token"),
                "requestBody": {
                    "required": True,
                    "content": {
                        JSON: {
                            "schema": strict_body(
                                ["policy"], {"policy": POLICY, "verifiedOpToken": OP_TOKEN}
                            )
                        }
                    },
                },
                "responses": {"200": CHANGED, **governed},
            },
            "delete": {
                "summary": "Remove a tenant (governed: operation tenant-policy, policy null); "
                "it stays removed, its tenants-file entry too, until a PUT",
                "tags": ["tenants"],
                "parameters": params("X-Op-Token"),
                "requestBody": {
                    "required": False,
                    "content": {JSON: {"schema": strict_body([], {"verifiedOpToken": OP_TOKEN})}},
                },
                "responses": {"200": CHANGED, **governed},
            },
        },
        "/v1/usage": {
            "get": {
                "summary": "Usage per tenant, model and hour or day (a tenant: its own)",
                "tags": ["tenants"],
                **who,
                "parameters": [*params(*IDENTITY_PARAMETERS), *query],
                "responses": {
                    "200": json_answer(USAGE, "The rows, oldest first."),
                    **errors(400, 401, 403, 429, 503),
                },
            }
        },
    }
