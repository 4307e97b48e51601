"""The signer registry: who may approve what, with which keys, until when.

Loaded once at start-up; `parse_registry` refuses (RegistryInvalid, naming the problem)
anything unsafe rather than guessing. A key's id is the lowercase hex SHA-256 of its raw
32-byte Ed25519 public key, so the same key can never hide under two ids.

    {"issuer": "gov-dev", "policyEpoch": 1, "expires": "2027-12-31T00:00:00Z",
     "principals": {"admin1": ["<b64url raw Ed25519 public key>", ...], ...},
     "operations": {"model-load": {"threshold": 2, "principals": ["admin1", ...]},
                    "cache-flush": {"threshold": 1, "principals": [...], "legacy": true}}}
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from governance.encoding import MAX_SAFE_INT, b64url_decode, loads_strict
from governance.errors import RegistryInvalid
from governance.token import OPERATIONS

LEGACY_PRINCIPAL = "legacy-hmac"
PRINCIPAL_NAME = re.compile(r"[a-z0-9._-]{1,64}")
_TOP_FIELDS = frozenset({"issuer", "policyEpoch", "expires", "principals", "operations"})
_OP_FIELDS = frozenset({"threshold", "principals", "legacy"})
_EXPIRES = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")


def key_id(raw_public_key: bytes) -> str:
    """Lowercase hex SHA-256 of the raw 32-byte Ed25519 public key."""
    return hashlib.sha256(raw_public_key).hexdigest()


@dataclass(frozen=True)
class SignerKey:
    kid: str
    principal: str
    public_key: Ed25519PublicKey


@dataclass(frozen=True)
class OperationPolicy:
    threshold: int
    principals: frozenset[str]
    legacy: bool


@dataclass(frozen=True)
class Registry:
    issuer: str
    policy_epoch: int
    expires_at: float
    principals: Mapping[str, tuple[str, ...]]
    keys: Mapping[str, SignerKey]
    operations: Mapping[str, OperationPolicy]

    def expired(self, now: float) -> bool:
        return now >= self.expires_at


def load_registry(path: str | Path) -> Registry:
    """Read and validate the registry file; any problem raises RegistryInvalid."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise RegistryInvalid(f"registry {path}: cannot read: {exc.strerror}") from exc
    try:
        return parse_registry(data)
    except RegistryInvalid as exc:
        raise RegistryInvalid(f"registry {path}: {exc}") from exc


def parse_registry(data: bytes | str) -> Registry:
    """Validate a registry document; the message of RegistryInvalid names the problem."""
    try:
        doc = loads_strict(data)
    except ValueError as exc:
        raise RegistryInvalid(f"not strict JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise RegistryInvalid("must be a JSON object")
    _fields(doc, _TOP_FIELDS, _TOP_FIELDS, "registry")
    issuer = doc["issuer"]
    if not isinstance(issuer, str) or not 0 < len(issuer) <= 256:
        raise RegistryInvalid("issuer must be a non-empty string")
    epoch = doc["policyEpoch"]
    if type(epoch) is not int or not 0 <= epoch <= MAX_SAFE_INT:
        raise RegistryInvalid("policyEpoch must be a non-negative integer")
    principals, keys = _principals(doc["principals"])
    return Registry(
        issuer=issuer,
        policy_epoch=epoch,
        expires_at=_expires(doc["expires"]),
        principals=principals,
        keys=keys,
        operations=_operations(doc["operations"], principals),
    )


def _fields(
    obj: dict[str, Any], required: frozenset[str], allowed: frozenset[str], what: str
) -> None:
    missing = required - obj.keys()
    if missing:
        raise RegistryInvalid(f"{what}: missing {sorted(missing)}")
    unknown = obj.keys() - allowed
    if unknown:
        raise RegistryInvalid(f"{what}: unknown fields {sorted(unknown)}")


def _expires(value: object) -> float:
    if not isinstance(value, str) or not _EXPIRES.fullmatch(value):
        raise RegistryInvalid("expires must be an RFC 3339 UTC time like 2027-12-31T00:00:00Z")
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError as exc:
        raise RegistryInvalid(f"expires is not a valid time: {exc}") from exc


def _principals(value: object) -> tuple[dict[str, tuple[str, ...]], dict[str, SignerKey]]:
    if not isinstance(value, dict) or not value:
        raise RegistryInvalid("principals must be a non-empty object")
    principals: dict[str, tuple[str, ...]] = {}
    keys: dict[str, SignerKey] = {}
    for name, encoded_keys in value.items():
        if not PRINCIPAL_NAME.fullmatch(name):
            raise RegistryInvalid(f"principal name {name!r} is not lowercase [a-z0-9._-]{{1,64}}")
        if name == LEGACY_PRINCIPAL:
            raise RegistryInvalid(f"principal name {name!r} is reserved for the legacy HMAC form")
        if not isinstance(encoded_keys, list) or not encoded_keys:
            raise RegistryInvalid(f"principal {name!r} must list at least one public key")
        kids = []
        for encoded in encoded_keys:
            raw = _public_key_bytes(name, encoded)
            kid = key_id(raw)
            if kid in keys:
                owner = keys[kid].principal
                where = "twice" if owner == name else f"also under principal {owner!r}"
                raise RegistryInvalid(f"principal {name!r}: key {kid[:16]}... is listed {where}")
            keys[kid] = SignerKey(kid, name, Ed25519PublicKey.from_public_bytes(raw))
            kids.append(kid)
        principals[name] = tuple(kids)
    return principals, keys


def _public_key_bytes(principal: str, encoded: object) -> bytes:
    if not isinstance(encoded, str):
        raise RegistryInvalid(f"principal {principal!r}: public keys must be strings")
    try:
        raw = b64url_decode(encoded)
    except ValueError as exc:
        raise RegistryInvalid(f"principal {principal!r}: key is not base64url: {exc}") from exc
    if len(raw) != 32:
        raise RegistryInvalid(f"principal {principal!r}: key is not 32 raw Ed25519 bytes")
    return raw


def _operations(
    value: object, principals: Mapping[str, tuple[str, ...]]
) -> dict[str, OperationPolicy]:
    if not isinstance(value, dict) or not value:
        raise RegistryInvalid("operations must be a non-empty object")
    policies: dict[str, OperationPolicy] = {}
    for operation, spec in value.items():
        what = f"operation {operation!r}"
        if operation not in OPERATIONS:
            raise RegistryInvalid(f"unknown operation {operation!r} (known: {list(OPERATIONS)})")
        if not isinstance(spec, dict):
            raise RegistryInvalid(f"{what} must be an object")
        _fields(spec, frozenset({"threshold", "principals"}), _OP_FIELDS, what)
        names = spec["principals"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise RegistryInvalid(f"{what}: principals must be a list of names")
        if len(set(names)) != len(names):
            raise RegistryInvalid(f"{what}: a principal is listed twice")
        undefined = [n for n in names if n not in principals]
        if undefined:
            raise RegistryInvalid(f"{what}: undefined principals {undefined}")
        threshold = spec["threshold"]
        if type(threshold) is not int:
            raise RegistryInvalid(f"{what}: threshold must be an integer")
        if not 1 <= threshold <= len(names):
            raise RegistryInvalid(
                f"{what}: threshold {threshold} must be between 1 and its {len(names)} principals"
            )
        legacy = spec.get("legacy", False)
        if not isinstance(legacy, bool):
            raise RegistryInvalid(f"{what}: legacy must be true or false")
        if legacy and threshold != 1:
            raise RegistryInvalid(
                f"{what}: legacy HMAC tokens count as one principal, so legacy needs threshold 1"
            )
        policies[operation] = OperationPolicy(threshold, frozenset(names), legacy)
    return policies
