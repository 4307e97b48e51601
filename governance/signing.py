"""Signer-side helpers: make keys, propose claims, add one signature, combine, inspect.

Pure functions over plain JSON documents; the CLI and the tests use them. A proposal is a
version-2 token with no signatures yet; each signer adds one signature on their own machine
and the outputs are combined, so no one ever holds more than their own key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from jwt.api_jws import PyJWS

from governance.encoding import b64url_decode, b64url_encode, canonical, loads_strict
from governance.registry import key_id
from governance.token import ALG, TYP, LegacyToken, load_envelope, parse_claims, parse_token

Document = dict[str, Any]
_JWS = PyJWS(algorithms=[ALG])


def generate_key(seed: bytes | None = None) -> Ed25519PrivateKey:
    """A new Ed25519 key; a fixed 32-byte `seed` gives a fixed key (test vectors only)."""
    if seed is None:
        return Ed25519PrivateKey.generate()
    return Ed25519PrivateKey.from_private_bytes(seed)


def private_key_pem(key: Ed25519PrivateKey) -> bytes:
    """PKCS#8 PEM, unencrypted (protect the file: the CLI writes it with mode 0600)."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def load_private_key(pem: bytes) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError("the key file does not hold an Ed25519 private key")
    return key


def raw_public_key(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def public_key_b64(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The public key as the registry holds it: base64url of the raw 32 bytes."""
    return b64url_encode(raw_public_key(key))


def kid_of(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    return key_id(raw_public_key(key))


def new_nonce() -> str:
    """192 random bits, base64url (32 characters)."""
    return b64url_encode(secrets.token_bytes(24))


def propose(
    *,
    operation: str,
    model_id: str | None,
    params: Mapping[str, object],
    aud: str,
    iss: str,
    issued_at: int,
    ttl_s: int = 300,
    policy_epoch: int = 1,
    nonce: str | None = None,
    signers: Sequence[str] = (),
) -> Document:
    """An unsigned version-2 token: the claims, fixed as bytes, and no signatures yet."""
    claims: dict[str, object] = {
        "operation": operation,
        "modelId": model_id,
        "params": dict(params),
        "aud": aud,
        "iss": iss,
        "issuedAt": issued_at,
        "expiresAt": issued_at + ttl_s,
        "nonce": nonce if nonce is not None else new_nonce(),
        "policyEpoch": policy_epoch,
    }
    if signers:
        claims["signers"] = list(signers)
    parse_claims(loads_strict(canonical(claims)))  # refuse what no verifier would accept
    return {"payload": b64url_encode(canonical(claims)), "signatures": []}


def sign(document: Mapping[str, Any], key: Ed25519PrivateKey) -> Document:
    """Add this key's signature over the document's exact payload bytes (idempotent)."""
    payload, signatures = _unpack(document)
    parse_claims(loads_strict(b64url_decode(payload)))
    kid = kid_of(key)
    compact = _JWS.encode(
        b64url_decode(payload), key, algorithm=ALG, headers={"kid": kid, "typ": TYP}
    )
    protected, signed_payload, signature = compact.split(".")
    if signed_payload != payload:  # pragma: no cover - PyJWT encodes bytes canonically
        raise ValueError("payload changed while signing")
    return combine(
        [
            {"payload": payload, "signatures": signatures},
            {"payload": payload, "signatures": [{"protected": protected, "signature": signature}]},
        ]
    )


def combine(documents: Iterable[Mapping[str, Any]]) -> Document:
    """Merge signatures over one payload, in order; identical entries are kept once."""
    payload: str | None = None
    merged: list[dict[str, str]] = []
    for document in documents:
        this_payload, signatures = _unpack(document)
        if payload is not None and this_payload != payload:
            raise ValueError("cannot combine tokens with different payloads")
        payload = this_payload
        for entry in signatures:
            if entry not in merged:
                merged.append(entry)
    if payload is None:
        raise ValueError("nothing to combine")
    return {"payload": payload, "signatures": merged}


def sign_legacy(claims: Mapping[str, object], key: bytes) -> Document:
    """The seed's HMAC form: {"opToken": claims, "signature": hex HMAC-SHA256(canonical)}."""
    mac = hmac.new(key, canonical(claims), hashlib.sha256).hexdigest()
    return {"opToken": dict(claims), "signature": mac}


def to_b64(document: Mapping[str, Any]) -> str:
    """The base64url form of a token ("eyJ..."), as sent in `verifiedOpToken`."""
    return b64url_encode(json.dumps(document, separators=(",", ":")).encode("utf-8"))


def inspect(raw: object) -> dict[str, Any]:
    """Decode a token or proposal without verifying anything (for humans)."""
    envelope = load_envelope(raw)
    if "opToken" in envelope:
        token = parse_token(envelope)
        assert isinstance(token, LegacyToken)
        return {"form": "legacy-hmac", "claims": envelope["opToken"]}
    payload, signatures = _unpack(envelope)
    claims = loads_strict(b64url_decode(payload))
    parse_claims(claims)
    headers = [loads_strict(b64url_decode(entry["protected"])) for entry in signatures]
    return {"form": "jws-general", "claims": claims, "signatures": headers}


def _unpack(document: Mapping[str, Any]) -> tuple[str, list[dict[str, str]]]:
    payload = document.get("payload")
    signatures = document.get("signatures", [])
    if set(document) - {"payload", "signatures"} or not isinstance(payload, str):
        raise ValueError("not a version-2 token or proposal (payload, signatures)")
    if not isinstance(signatures, list) or not all(
        isinstance(e, dict)
        and set(e) == {"protected", "signature"}
        and all(isinstance(v, str) for v in e.values())
        for e in signatures
    ):
        raise ValueError("signatures must be a list of {protected, signature} entries")
    return payload, [dict(e) for e in signatures]
