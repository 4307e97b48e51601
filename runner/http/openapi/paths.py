"""The runner's operations, path by path, for its OpenAPI document (`runner/http/openapi`).

Each operation lists every status the runner can answer it with. Errors answer in the
envelope (`#/components/responses/E<status>`); on the data path (chat, audio, images)
they carry the data path's headers too (`D<status>`). Bodies are as strict as the runner
is: a field the runner refuses is not allowed here either.
"""

from __future__ import annotations

from collections.abc import Sequence

from adapters.image_request import IGNORED_IMAGE_FIELDS, MAX_N, MAX_SEED
from runner.http.audio.formats import RESPONSE_FORMATS
from runner.http.openapi.components import (
    DATA_PATH_PARAMETERS,
    IDENTITY_PARAMETERS,
    Schema,
    header_refs,
)

JSON = "application/json"
SSE = "text/event-stream"


def ref(kind: str, name: str) -> Schema:
    return {"$ref": f"#/components/{kind}/{name}"}


def errors(*statuses: int, data: bool = False) -> dict[str, Schema]:
    """References to the error answers: `E` the envelope, `D` with the data path's
    headers (an engine's own refusal is answered in the envelope too)."""
    prefix = "D" if data else "E"
    return {str(s): ref("responses", f"{prefix}{s}") for s in statuses}


def json_answer(
    schema: Schema, description: str, headers: dict[str, Schema] | None = None
) -> Schema:
    out: Schema = {"description": description, "content": {JSON: {"schema": schema}}}
    if headers:
        out["headers"] = headers
    return out


def params(*names: str) -> list[Schema]:
    return [ref("parameters", n) for n in names]


def path_param(name: str, description: str) -> Schema:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "string", "minLength": 1},
    }


OPTIONAL_KEY: list[dict[str, list[str]]] = [{}, {"apiKey": []}]
"""Inference identity: an API key where keys are configured, X-Tenant-ID otherwise."""

DATA_OK_HEADERS = header_refs(
    (
        "X-Request-Id",
        "X-Cache-Hit",
        "X-Cache-Tokens-Reused",
        "X-Queue-Wait-Ms",
        "X-GPU-Time-Ms",
        "RateLimit-Limit",
        "RateLimit-Remaining",
        "RateLimit-Reset",
        "X-Effective-Priority",
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
        "X-Budget-Wait-Ms",
    ),
    required=("X-Request-Id", "X-Cache-Hit", "X-Cache-Tokens-Reused", "X-Queue-Wait-Ms"),
)
JOB_ACCEPTED = json_answer(
    ref("schemas", "Job"),
    "Taken as a job (`Prefer: respond-async`): poll `Location`.",
    {
        **DATA_OK_HEADERS,
        **header_refs(("Location", "Preference-Applied"), ("Location", "Preference-Applied")),
    },
)

SSE_EVENT: Schema = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}},
    "description": "One server-sent event; `data: [DONE]` ends an OpenAI stream, "
    '`data: {"error": {...}}` one that failed after its headers.',
}


def _model_field(models: Sequence[str]) -> Schema:
    field: Schema = {"type": "string", "minLength": 1, "description": "A model of this runner."}
    if models:
        field["examples"] = list(models)
    return field


def _inference(models: Sequence[str], summary: str, required: str, value: Schema) -> Schema:
    """One of the OpenAI-compatible text paths, forwarded to the model's engine."""
    body: Schema = {
        "type": "object",
        "required": ["model", required],
        "properties": {
            "model": _model_field(models),
            required: value,
            "stream": {"type": ["boolean", "null"]},
        },
        "description": "OpenAI's body: OpenAI's fields for the endpoint and those the "
        "model's engine kind declares (docs/api.md, Accepted fields); any other is 400 "
        "unsupported_parameter naming it, as are `n`/`best_of` above 1 and several prompts "
        "in one. The rest goes to the engine as sent once the runner has checked its "
        "numeric fields (token limits, sampling ranges); the engine's own refusals are "
        "answered in the envelope. Fields named `x_*` are runner extensions, removed "
        "before forwarding.",
    }
    ok: Schema = {
        "description": "The engine's answer (a stream of server-sent events with `stream: true`).",
        "headers": DATA_OK_HEADERS,
        "content": {JSON: {"schema": {"type": "object"}}, SSE: {"schema": SSE_EVENT}},
    }
    return {
        "post": {
            "summary": summary,
            "tags": ["inference"],
            "security": OPTIONAL_KEY,
            "parameters": params(*DATA_PATH_PARAMETERS),
            "requestBody": {"required": True, "content": {JSON: {"schema": body}}},
            "responses": {
                "200": ok,
                **errors(400, 401, 403, 404, 405, 413, 415, 429, 502, 503, 504, data=True),
            },
        }
    }


MESSAGES: Schema = {
    "type": "array",
    "description": "OpenAI's messages (`{role, content}`), checked by the engine.",
    "items": {"examples": [{"role": "user", "content": "Hello"}]},
}
TEXT_INPUT: Schema = {
    "description": "A string or a list of them, checked by the engine.",
    "examples": ["Hello"],
}


def _audio(models: Sequence[str], summary: str) -> Schema:
    form: Schema = {
        "type": "object",
        "required": ["file", "model"],
        "properties": {
            "file": {"type": "string", "contentMediaType": "application/octet-stream"},
            "model": _model_field(models),
            "language": {"type": "string", "description": "ISO-639-1 (transcriptions)"},
            "prompt": {"type": "string"},
            "response_format": {"type": "string", "enum": sorted(RESPONSE_FORMATS)},
            "temperature": {"type": "number", "minimum": 0, "maximum": 1},
            "stream": {"type": "boolean"},
            "webhook": {"type": "string", "format": "uri"},
        },
    }
    ok: Schema = {
        "description": "The transcript in `response_format` (json, verbose_json: an "
        "object; text, srt, vtt: text; `stream`: server-sent events).",
        "headers": DATA_OK_HEADERS,
        "content": {
            JSON: {"schema": {"type": "object"}},
            "text/plain": {"schema": {"type": "string"}},
            SSE: {"schema": SSE_EVENT},
        },
    }
    return {
        "post": {
            "summary": summary,
            "tags": ["speech"],
            "security": OPTIONAL_KEY,
            "parameters": params(*DATA_PATH_PARAMETERS, "Prefer"),
            "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": form}}},
            "responses": {
                "200": ok,
                "202": JOB_ACCEPTED,
                **errors(400, 401, 403, 404, 405, 413, 429, 502, 503, data=True),
            },
        }
    }


def _images(models: Sequence[str]) -> Schema:
    ignored: Schema = {name: {} for name in sorted(IGNORED_IMAGE_FIELDS)}
    body: Schema = {
        "type": "object",
        "required": ["model", "prompt"],
        "description": "OpenAI's fields (those it names that ComfyUI has no use for are "
        "ignored); the model's workflow template bounds its parameters further (the "
        "built-in one: 64-2048 pixels a side in steps of 8, n up to 8, x_steps 1-150, x_cfg "
        "0-30), else 400 invalid_workflow_parameter.",
        "properties": {
            "model": _model_field(models),
            "prompt": {"type": "string", "pattern": "\\S"},
            "n": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_N},
            "size": {
                "type": ["string", "null"],
                "pattern": "^(auto|[1-9][0-9]{0,4}x[1-9][0-9]{0,4})$",
            },
            "response_format": {"enum": ["b64_json", "url", None]},
            "output_format": {"enum": ["png", None]},
            "x_seed": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_SEED},
            "x_negative_prompt": {"type": ["string", "null"]},
            "x_steps": {"type": ["integer", "null"]},
            "x_cfg": {"type": ["number", "null"]},
            "webhook": {"type": ["string", "null"], "description": "With `Prefer: respond-async`."},
            **ignored,
        },
        "additionalProperties": False,
    }
    answer: Schema = {
        "type": "object",
        "required": ["created", "data"],
        "properties": {"created": {"type": "integer"}, "data": {"type": "array"}},
    }
    return {
        "post": {
            "summary": "Generate images (ComfyUI models)",
            "tags": ["images"],
            "security": OPTIONAL_KEY,
            "parameters": params(*DATA_PATH_PARAMETERS, "Prefer"),
            "requestBody": {"required": True, "content": {JSON: {"schema": body}}},
            "responses": {
                "200": json_answer(answer, "The images.", DATA_OK_HEADERS),
                "202": JOB_ACCEPTED,
                **errors(400, 401, 403, 404, 405, 413, 415, 429, 502, 503, data=True),
            },
        }
    }


def data_path(models: Sequence[str]) -> dict[str, Schema]:
    token = {
        "name": "file",
        "in": "path",
        "required": True,
        "description": "`<token>.png`, as an answer's `url` names it.",
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{32}\\.png$"},
    }
    png = {"description": "The image.", "content": {"image/png": {"schema": {}}}}
    return {
        "/v1/chat/completions": _inference(models, "Chat completion", "messages", MESSAGES),
        "/v1/completions": _inference(models, "Text completion", "prompt", TEXT_INPUT),
        "/v1/embeddings": _inference(models, "Embeddings", "input", TEXT_INPUT),
        "/v1/audio/transcriptions": _audio(models, "Transcribe audio (faster-whisper models)"),
        "/v1/audio/translations": _audio(models, "Translate audio to English text"),
        "/v1/images/generations": _images(models),
        "/v1/images/files/{file}": {
            "get": {
                "summary": "An image kept for a `response_format: url` answer",
                "tags": ["images"],
                "parameters": [token],
                "responses": {
                    "200": {**png, "headers": header_refs(("X-Request-Id",), ("X-Request-Id",))},
                    **errors(404, 405, 503, data=True),
                },
            }
        },
    }


def jobs() -> dict[str, Schema]:
    job = json_answer(ref("schemas", "Job"), "The job.")
    return {
        "/v1/jobs/{jobId}": {
            "parameters": [path_param("jobId", "The job's id (a 202's `Location`).")],
            "get": {
                "summary": "An async job (its creator's tenant only)",
                "tags": ["jobs"],
                "security": OPTIONAL_KEY,
                "parameters": params(*IDENTITY_PARAMETERS),
                "responses": {"200": job, **errors(400, 401, 403, 404, 429, 503)},
            },
            "delete": {
                "summary": "Cancel an async job",
                "tags": ["jobs"],
                "security": OPTIONAL_KEY,
                "parameters": params(*IDENTITY_PARAMETERS),
                "responses": {
                    "200": job,
                    "202": json_answer(
                        ref("schemas", "Job"), "Handed to the replica that runs it."
                    ),
                    **errors(400, 401, 403, 404, 429, 503),
                },
            },
        }
    }
