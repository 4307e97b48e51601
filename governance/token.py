"""The op-token forms, parsed strictly: version 2 (JWS General JSON) and the legacy HMAC form.

`parse_token` is verification step 1 (413/400); `read_protected_header` is the header half
of step 2 (401). Neither checks a signature: `verifier.py` does, with the registry's keys.

Version 2:   {"payload": b64url(claims JSON bytes),
              "signatures": [{"protected": b64url(header JSON), "signature": b64url(sig)}, ...]}
             sent as that object, or as b64url of its JSON text (a string starting "eyJ").
Legacy:      {"opToken": {claims}, "signature": "<hex HMAC-SHA256 of canonical(claims)>"}
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from governance.encoding import MAX_SAFE_INT, b64url_decode, canonical, check_value, loads_strict
from governance.errors import BadSignature, MalformedToken, TokenTooLarge

MAX_TOKEN_BYTES = 16 * 1024
MAX_SIGNATURES = 16
ALG = "EdDSA"
TYP = "quorum-optoken+json"
OPERATIONS = (
    "model-load",
    "model-unload",
    "cache-flush",
    "task-cancel",
    "tenant-policy",
    "adapter-load",
    "adapter-unload",
)
RESERVED_PARAMS = ("modelId", "verifiedOpToken")
_NONCE = re.compile(r"[A-Za-z0-9_-]{22,64}")
_KID = re.compile(r"[0-9a-f]{64}")
_HEX_MAC = re.compile(r"[0-9a-fA-F]{64}")

_V2_REQUIRED = frozenset(
    {
        "operation",
        "modelId",
        "params",
        "aud",
        "iss",
        "issuedAt",
        "expiresAt",
        "nonce",
        "policyEpoch",
    }
)
_LEGACY_REQUIRED = frozenset({"operation", "issuedAt", "nonce"})
_ALL_CLAIMS = _V2_REQUIRED | {"signers"}


@dataclass(frozen=True)
class Claims:
    """What the signers approved. Legacy tokens may leave aud/iss/policyEpoch unset (None)."""

    operation: str
    model_id: str | None
    params: Mapping[str, object]
    aud: str | None
    iss: str | None
    issued_at: int
    expires_at: int
    nonce: str
    policy_epoch: int | None
    signers: tuple[str, ...]


@dataclass(frozen=True)
class SignatureEntry:
    protected: str
    signature: str


@dataclass(frozen=True)
class JwsToken:
    payload: str
    claims: Claims
    signatures: tuple[SignatureEntry, ...]

    def compact(self, entry: SignatureEntry) -> str:
        """The compact JWS `protected.payload.signature` of this entry."""
        return f"{entry.protected}.{self.payload}.{entry.signature}"

    def signing_input(self, entry: SignatureEntry) -> bytes:
        """What an Ed25519 JWS signature covers: ASCII(protected || "." || payload)."""
        return f"{entry.protected}.{self.payload}".encode("ascii")


@dataclass(frozen=True)
class LegacyToken:
    claims: Claims
    signed_bytes: bytes
    mac: bytes


def parse_token(raw: object) -> JwsToken | LegacyToken:
    """Step 1: size (413), then strict structure and claims (400)."""
    obj = load_envelope(raw)
    if "opToken" in obj:
        return _parse_legacy(obj)
    if "payload" in obj:
        return _parse_jws(obj)
    raise MalformedToken("token is neither a JWS (payload/signatures) nor a legacy opToken")


def read_protected_header(entry: SignatureEntry) -> tuple[str, bytes]:
    """Step 2 (header half): strict header with exactly alg, kid, typ; return (kid, signature)."""
    kid = _header_kid(entry.protected)
    try:
        signature = b64url_decode(entry.signature)
    except ValueError as exc:
        raise BadSignature(f"signature is not strict base64url: {exc}") from exc
    if len(signature) != 64:
        raise BadSignature("an Ed25519 signature is 64 bytes")
    return kid, signature


@functools.lru_cache(maxsize=256)
def _header_kid(protected: str) -> str:
    """The kid of a valid protected header (pure, so a signer's repeated header is cached)."""
    try:
        header = loads_strict(b64url_decode(protected))
    except ValueError as exc:
        raise BadSignature(f"protected header is not strict base64url JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise BadSignature("protected header is not a JSON object")
    if "crit" in header:
        raise BadSignature("protected header must not carry 'crit'")
    if set(header) != {"alg", "kid", "typ"}:
        raise BadSignature(
            f"protected header must hold exactly alg, kid, typ, not {sorted(header)}"
        )
    if header["alg"] != ALG:
        raise BadSignature(f"alg must be exactly {ALG!r}")
    if header["typ"] != TYP:
        raise BadSignature(f"typ must be exactly {TYP!r}")
    kid = header["kid"]
    if not isinstance(kid, str) or not _KID.fullmatch(kid):
        raise BadSignature("kid must be 64 lowercase hex characters")
    return kid


def load_envelope(raw: object) -> dict[str, Any]:
    """Step 1, first half: a size-checked, strictly parsed JSON object (413/400)."""
    if isinstance(raw, str):
        if (
            len(raw) > MAX_TOKEN_BYTES
            or len(raw.encode("utf-8", "surrogatepass")) > MAX_TOKEN_BYTES
        ):
            raise TokenTooLarge(f"token is larger than {MAX_TOKEN_BYTES} bytes")
        try:
            if raw.startswith("{"):
                value = loads_strict(raw)
            elif raw.startswith("eyJ"):
                value = loads_strict(b64url_decode(raw))
            else:
                raise ValueError("a token string must be JSON or base64url JSON ('eyJ...')")
        except ValueError as exc:
            raise MalformedToken(f"token: {exc}") from exc
    elif isinstance(raw, dict):
        try:
            size = len(canonical(raw))
        except (TypeError, ValueError, RecursionError) as exc:
            raise MalformedToken(f"token is not plain JSON: {exc}") from exc
        if size > MAX_TOKEN_BYTES:
            raise TokenTooLarge(f"token is larger than {MAX_TOKEN_BYTES} bytes")
        try:
            check_value(raw)
        except ValueError as exc:
            raise MalformedToken(f"token: {exc}") from exc
        value = raw
    else:
        raise MalformedToken("token must be a JSON object or a string")
    if not isinstance(value, dict):
        raise MalformedToken("token must be a JSON object")
    return value


def _exact_keys(
    obj: dict[str, Any], required: frozenset[str], allowed: frozenset[str], what: str
) -> None:
    missing = required - obj.keys()
    if missing:
        raise MalformedToken(f"{what}: missing {sorted(missing)}")
    unknown = obj.keys() - allowed
    if unknown:
        raise MalformedToken(f"{what}: unknown fields {sorted(unknown)}")


def _parse_jws(obj: dict[str, Any]) -> JwsToken:
    fields = frozenset({"payload", "signatures"})
    _exact_keys(obj, fields, fields, "token")
    payload, signatures = obj["payload"], obj["signatures"]
    if not isinstance(payload, str):
        raise MalformedToken("payload must be a string")
    if not isinstance(signatures, list) or not 1 <= len(signatures) <= MAX_SIGNATURES:
        raise MalformedToken(f"signatures must be a list of 1..{MAX_SIGNATURES} entries")
    entries = []
    entry_fields = frozenset({"protected", "signature"})
    for item in signatures:
        if not isinstance(item, dict):
            raise MalformedToken("each signature must be an object")
        _exact_keys(item, entry_fields, entry_fields, "signature entry")
        if not isinstance(item["protected"], str) or not isinstance(item["signature"], str):
            raise MalformedToken("protected and signature must be strings")
        entries.append(SignatureEntry(item["protected"], item["signature"]))
    try:
        claims_obj = loads_strict(b64url_decode(payload))
    except ValueError as exc:
        raise MalformedToken(f"payload: {exc}") from exc
    claims = _parse_claims(claims_obj, _V2_REQUIRED)
    return JwsToken(payload=payload, claims=claims, signatures=tuple(entries))


def parse_claims(obj: object) -> Claims:
    """Strictly parse version-2 claims (400 on any problem)."""
    return _parse_claims(obj, _V2_REQUIRED)


def _parse_legacy(obj: dict[str, Any]) -> LegacyToken:
    fields = frozenset({"opToken", "signature"})
    _exact_keys(obj, fields, fields, "legacy token")
    mac = obj["signature"]
    if not isinstance(mac, str) or not _HEX_MAC.fullmatch(mac):
        raise MalformedToken("legacy signature must be 64 hex characters (HMAC-SHA256)")
    claims = _parse_claims(obj["opToken"], _LEGACY_REQUIRED)
    return LegacyToken(
        claims=claims, signed_bytes=canonical(obj["opToken"]), mac=bytes.fromhex(mac)
    )


def _parse_claims(obj: object, required: frozenset[str]) -> Claims:
    if not isinstance(obj, dict):
        raise MalformedToken("claims must be a JSON object")
    _exact_keys(obj, required, _ALL_CLAIMS, "claims")
    operation = _text(obj, "operation", 32)
    if operation not in OPERATIONS:
        raise MalformedToken(f"operation must be one of {list(OPERATIONS)}")
    nonce = _text(obj, "nonce", 64)
    if not _NONCE.fullmatch(nonce):
        raise MalformedToken("nonce must be 22..64 base64url characters (>= 128 bits)")
    params = obj.get("params", {})
    if not isinstance(params, dict):
        raise MalformedToken("params must be an object")
    reserved = [key for key in RESERVED_PARAMS if key in params]
    if reserved:
        raise MalformedToken(f"params must not contain {reserved}")
    signers = obj.get("signers", [])
    if (
        not isinstance(signers, list)
        or len(signers) > 64
        or not all(isinstance(s, str) and 0 < len(s) <= 64 for s in signers)
    ):
        raise MalformedToken("signers must be a list of at most 64 short strings")
    issued_at = _integer(obj, "issuedAt")
    expires_at = _integer(obj, "expiresAt") if "expiresAt" in obj else issued_at + 300
    return Claims(
        operation=operation,
        model_id=_optional_text(obj, "modelId", 1024, optional=True),
        params=params,
        aud=_optional_text(obj, "aud", 256, optional="aud" not in required),
        iss=_optional_text(obj, "iss", 256, optional="iss" not in required),
        issued_at=issued_at,
        expires_at=expires_at,
        nonce=nonce,
        policy_epoch=_integer(obj, "policyEpoch") if "policyEpoch" in obj else None,
        signers=tuple(signers),
    )


def _text(obj: dict[str, Any], name: str, max_len: int) -> str:
    value = obj.get(name)
    if not isinstance(value, str) or not 0 < len(value) <= max_len:
        raise MalformedToken(f"{name} must be a non-empty string of at most {max_len} characters")
    return value


def _optional_text(obj: dict[str, Any], name: str, max_len: int, optional: bool) -> str | None:
    if optional and obj.get(name) is None:
        return None
    return _text(obj, name, max_len)


def _integer(obj: dict[str, Any], name: str) -> int:
    value = obj[name]
    if type(value) is not int:
        raise MalformedToken(f"{name} must be an integer")
    if not 0 <= value <= MAX_SAFE_INT:
        raise MalformedToken(f"{name} is out of range")
    return value
