"""Shared test kit: fixed keys, a movable clock, a test registry and token builders."""

from __future__ import annotations

import json
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governance import signing
from governance.audit import MemoryAuditSink
from governance.encoding import b64url_decode, b64url_encode, canonical
from governance.nonces import MemoryNonceStore
from governance.registry import Registry, parse_registry
from governance.verifier import Verifier

NOW = 1_767_225_600  # 2026-01-01T00:00:00Z
RUNNER = "runner-a"
ISSUER = "gov-test"
LEGACY_KEY = b"legacy-test-key-0123456789abcdef"
OPERATION, MODEL, PARAMS = "model-load", "meta-llama/Llama-3.1-8B", {"quantization": "awq-4bit"}
DROP = object()

A1 = signing.generate_key(bytes([1]) * 32)
A2 = signing.generate_key(bytes([2]) * 32)
A3 = signing.generate_key(bytes([3]) * 32)
A1_NEW = signing.generate_key(bytes([11]) * 32)  # admin1's rotated key
OUTSIDER = signing.generate_key(bytes([99]) * 32)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def registry_doc(**overrides: Any) -> dict[str, Any]:
    everyone = ["admin1", "admin2", "admin3"]
    doc: dict[str, Any] = {
        "issuer": ISSUER,
        "policyEpoch": 3,
        "expires": "2027-12-31T00:00:00Z",
        "principals": {
            "admin1": [signing.public_key_b64(A1), signing.public_key_b64(A1_NEW)],
            "admin2": [signing.public_key_b64(A2)],
            "admin3": [signing.public_key_b64(A3)],
        },
        "operations": {
            "model-load": {"threshold": 2, "principals": everyone},
            "model-unload": {"threshold": 2, "principals": everyone},
            "cache-flush": {"threshold": 1, "principals": everyone, "legacy": True},
            "task-cancel": {"threshold": 1, "principals": ["admin1"]},
        },
    }
    doc.update(overrides)
    return doc


def make_registry(**overrides: Any) -> Registry:
    return parse_registry(json.dumps(registry_doc(**overrides)))


def make_verifier(
    clock: Clock | None = None, legacy_key: bytes | None = None, **registry_overrides: Any
) -> tuple[Verifier, MemoryNonceStore, MemoryAuditSink]:
    clock = clock or Clock()
    nonces, audit = MemoryNonceStore(clock), MemoryAuditSink()
    verifier = Verifier(
        make_registry(**registry_overrides), nonces, audit, RUNNER, clock, legacy_key=legacy_key
    )
    return verifier, nonces, audit


_counter = 0


def fresh_nonce() -> str:
    global _counter
    _counter += 1
    return f"nonce-{_counter:06d}-abcdefghijklmnop"


def claims(**overrides: Any) -> dict[str, Any]:
    """Valid claims for OPERATION/MODEL/PARAMS at NOW; DROP removes a field."""
    body: dict[str, Any] = {
        "operation": OPERATION,
        "modelId": MODEL,
        "params": dict(PARAMS),
        "aud": RUNNER,
        "iss": ISSUER,
        "issuedAt": NOW,
        "expiresAt": NOW + 300,
        "nonce": fresh_nonce(),
        "policyEpoch": 3,
    }
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not DROP}


def payload_of(body: dict[str, Any] | bytes) -> str:
    return b64url_encode(body if isinstance(body, bytes) else canonical(body))


def header(key: Ed25519PrivateKey, **overrides: Any) -> dict[str, Any]:
    head: dict[str, Any] = {
        "alg": "EdDSA",
        "kid": signing.kid_of(key),
        "typ": "quorum-optoken+json",
    }
    head.update(overrides)
    return {k: v for k, v in head.items() if v is not DROP}


def entry(
    key: Ed25519PrivateKey,
    payload: str,
    head: dict[str, Any] | None = None,
    protected: str | None = None,
) -> dict[str, str]:
    """One signature entry; `head`/`protected` let a test forge the header."""
    if protected is None:
        protected = b64url_encode(json.dumps(head or header(key)).encode())
    signature = key.sign(f"{protected}.{payload}".encode("ascii"))
    return {"protected": protected, "signature": b64url_encode(signature)}


def token(
    body: dict[str, Any] | bytes | None = None,
    keys: tuple[Ed25519PrivateKey, ...] = (A1, A2),
) -> dict[str, Any]:
    payload = payload_of(claims() if body is None else body)
    return {"payload": payload, "signatures": [entry(k, payload) for k in keys]}


def flip_bit(signature: str) -> str:
    """The same base64url signature with one bit flipped."""
    raw = bytearray(b64url_decode(signature))
    raw[10] ^= 1
    return b64url_encode(bytes(raw))
