"""Op tokens as the client handles them: read from a file, claims read without verifying.

Signing and verifying stay with governance (`quorum token ...`); the client only carries
a token to the runner. It does read the token's claims (they are not secret: every
signer inspects them) to build the request body the signers approved: the runner binds
the body's fields, other than `modelId` and `verifiedOpToken`, to the claims' `params`
exactly, so the body is made from them rather than typed again.

Forms (docs/governance.md): the JWS JSON document `{"payload", "signatures"}`, the same as
base64url text (starting `eyJ`), that text as a JSON string (what `--b64` prints), and the
legacy `{"opToken": {...}, "signature"}`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from client.errors import BadToken


@dataclass(frozen=True, slots=True)
class OpToken:
    raw: object
    """What is sent as `verifiedOpToken`: the document, or its base64url text."""
    operation: str
    model_id: str | None
    params: Mapping[str, Any]
    aud: str | None
    """The runner id the token is addressed to."""

    def body(self, **extra: object) -> dict[str, Any]:
        """The request body the signers approved: modelId (when named), params, the token."""
        body: dict[str, Any] = {}
        if self.model_id is not None:
            body["modelId"] = self.model_id
        body.update(self.params)
        body.update(extra)
        body["verifiedOpToken"] = self.raw
        return body


def read_token(path: str | Path) -> OpToken:
    """The token in a file (BadToken if it holds none)."""
    try:
        text = Path(path).read_text("utf-8")
    except OSError as exc:
        raise BadToken(f"{path}: cannot read ({exc.strerror or exc})") from None
    return parse_token(text)


def parse_token(value: object) -> OpToken:
    """A token from text (any form above) or an already-parsed document."""
    raw: object = value
    if isinstance(value, str):
        text = value.strip()
        if text.startswith('"'):
            text = str(_json(text))
        raw = _json(text) if text.startswith("{") else text
    doc = _document(raw)
    claims = _claims(doc)
    operation = claims.get("operation")
    params = claims.get("params", {})
    model_id = claims.get("modelId")
    if not isinstance(operation, str) or not isinstance(params, dict):
        raise BadToken("the token's claims name no operation or carry no params object")
    if model_id is not None and not isinstance(model_id, str):
        raise BadToken("the token's modelId is not a string")
    aud = claims.get("aud")
    return OpToken(raw, operation, model_id, params, aud if isinstance(aud, str) else None)


def _document(raw: object) -> dict[str, Any]:
    if isinstance(raw, str):
        if not raw.startswith("eyJ"):
            raise BadToken("not a token: expected a JSON document or base64url text (eyJ...)")
        raw = _json(_b64(raw))
    if not isinstance(raw, dict):
        raise BadToken("not a token document")
    return raw


def _claims(doc: dict[str, Any]) -> dict[str, Any]:
    if isinstance(doc.get("opToken"), dict):  # the legacy HMAC form
        claims: dict[str, Any] = doc["opToken"]
        return claims
    payload = doc.get("payload")
    if not isinstance(payload, str):
        raise BadToken("not a token: no payload")
    decoded = _json(_b64(payload))
    if not isinstance(decoded, dict):
        raise BadToken("the token's payload is not a claims object")
    return decoded


def _b64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError as exc:
        raise BadToken(f"not base64url: {exc}") from None


def _json(text: str | bytes) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise BadToken(f"not JSON: {exc}") from None
