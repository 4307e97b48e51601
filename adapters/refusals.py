"""An engine's own refusal (any answer but 200) as one of the runner's error rows.

llama-server answers `{"error": {"code": 400, "type": "exceed_context_size_error",
"message": ..., "n_prompt_tokens", "n_ctx"}}`, vLLM `{"error": {"message", "type":
"BadRequestError", "param", "code": 400}}` (older releases the same fields at the top level
with `"object": "error"`), FastAPI `{"detail": ...}`, others plain text. The client gets
the runner's envelope instead (a string `code`, OpenAI's `type`, the engine's message kept
once made safe), so one parser reads every error whatever the engine.

`refusal` is pure: the data path (runner/http/chat.py) gives it the status and body and raises
what it returns; the engine's body as it wrote it goes to the runner's log only.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from adapters.errors import (
    ContextLengthExceeded,
    EngineBusy,
    EngineError,
    EngineRefused,
    EngineRejected,
    EngineTimeout,
    UnsupportedRequest,
)
from faults import PayloadTooLarge, QuorumError

MAX_MESSAGE = 300
"""Characters of the engine's message kept (a refusal is one sentence; more is a dump)."""

_PATH = re.compile(r"(?<![\w.:/])(?:~|\.{1,2})?(?:/[\w.+@-]+){2,}/?")
_REQUEST_ID = re.compile(
    r"\b(?:chatcmpl|cmpl|embd|req|request|task|prompt)[-_][\w-]{6,}\b"
    r"|\b[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}\b",
    re.IGNORECASE,
)
_CONTEXT_TYPES = frozenset({"exceed_context_size_error", "context_length_exceeded"})
_CONTEXT_WORDS = re.compile(r"context (?:length|size|window)|max_model_len", re.IGNORECASE)


def safe_message(text: str) -> str:
    """The engine's message fit for a tenant: one line, file paths and request ids
    replaced, at most `MAX_MESSAGE` characters (the rest of a dump is cut)."""
    text = " ".join(text.split())
    text = _PATH.sub("<path>", text)
    text = _REQUEST_ID.sub("<id>", text)
    if len(text) > MAX_MESSAGE:
        text = text[: MAX_MESSAGE - 1].rstrip() + "…"
    return text


def refusal(status: int, payload: bytes, model: str) -> QuorumError:
    """The row for an engine's answer `status` (not 200) with body `payload`.

    1. Read the engine's message, type, param and figures from its body (OpenAI's
       `{"error": {...}}`, vLLM's top-level fields, FastAPI's `detail`, or plain text);
       make the message safe (`safe_message`).
    2. A prompt (or `max_tokens`) over the context: 400 `context_length_exceeded`, with
       the engine's token figures when it gave them.
    3. 400 / 422: the request itself was refused: 400 `invalid_request` (`param` kept).
    4. 413: 413 `payload_too_large`.
    5. 501: a feature this engine does not serve: 400 `unsupported_parameter`.
    6. 429 / 503 (busy, or still loading): 503 `engine_busy` with `Retry-After`.
    7. 504: `engine_timeout`.
    8. Any other 4xx (401, 403, 404, ...) refuses the runner, not the client: 502
       `engine_refused`.
    9. Any other status: 502 `engine_error`.
    """
    error = _error_object(payload)  # 1
    text = error.get("message")
    if not isinstance(text, str) or not text.strip():
        text = error.get("detail") if isinstance(error.get("detail"), str) else ""
    kind = error.get("type")
    said = safe_message(str(text)) or f"HTTP {status}"
    message = f"the engine of model {model!r} refused the request: {said}"
    param = error.get("param")
    extra: dict[str, object] = {"param": param} if isinstance(param, str) and param else {}
    if status in (400, 413, 422) and (kind in _CONTEXT_TYPES or _CONTEXT_WORDS.search(said)):
        for ours, theirs in (("promptTokens", "n_prompt_tokens"), ("contextLength", "n_ctx")):
            value = error.get(theirs)
            if isinstance(value, int) and not isinstance(value, bool):
                extra[ours] = value
        return ContextLengthExceeded(message, extra=extra)  # 2
    if status in (400, 422):
        return EngineRejected(message, extra=extra)  # 3
    if status == 413:
        return PayloadTooLarge(message)  # 4
    if status == 501:
        return UnsupportedRequest(message, extra=extra)  # 5
    if status in (429, 503):
        return EngineBusy(model=model, said=said, retry_after=1)  # 6
    if status == 504:
        return EngineTimeout(message)  # 7
    if 400 <= status < 500:
        return EngineRefused(message, extra={"engineStatus": status})  # 8
    return EngineError(message, extra={"engineStatus": status})  # 9


def _error_object(payload: bytes) -> dict[str, Any]:
    """The fields of the engine's error body, whatever its shape (empty when none)."""
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError:
        text = payload.decode("utf-8", "replace").strip()
        return {"message": text} if text and not text.startswith("<") else {}
    if not isinstance(doc, dict):
        return {}
    inner = doc.get("error")
    if isinstance(inner, dict):
        return inner
    if isinstance(inner, str):  # vLLM's 401 `{"error": "Unauthorized"}`
        return {**doc, "message": inner}
    detail = doc.get("detail")
    if isinstance(detail, list):  # FastAPI's validation errors
        return {
            **doc,
            "message": "; ".join(str(d.get("msg", d)) for d in detail[:3] if isinstance(d, dict)),
        }
    return doc
