"""The signer registry: what loads, and each unsafe registry start-up must refuse."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from governance import signing
from governance.encoding import b64url_encode
from governance.errors import RegistryInvalid
from governance.registry import key_id, load_registry, parse_registry
from tests.governance.support import A1, A2, NOW, registry_doc

KEYS_DIR = Path(__file__).resolve().parents[2] / "keys"


def changed(path: str, value: object) -> dict[str, Any]:
    """registry_doc() with the value at a dotted path replaced (None deletes it)."""
    doc = registry_doc()
    *parents, last = path.split(".")
    node = doc
    for part in parents:
        node = node[part]
    if value is None:
        del node[last]
    else:
        node[last] = value
    return doc


A1_PUB, A2_PUB = signing.public_key_b64(A1), signing.public_key_b64(A2)
UNSAFE = {
    "threshold-zero": (changed("operations.model-load.threshold", 0), "threshold 0"),
    "threshold-negative": (changed("operations.model-load.threshold", -1), "threshold -1"),
    "threshold-above-principals": (changed("operations.model-load.threshold", 4), "threshold 4"),
    "threshold-bool": (changed("operations.cache-flush.threshold", True), "integer"),
    "key-twice-same-principal": (changed("principals.admin2", [A2_PUB, A2_PUB]), "twice"),
    "key-under-two-principals": (changed("principals.admin2", [A1_PUB]), "also under"),
    "principal-uppercase": (
        changed(
            "principals.Admin4", [signing.public_key_b64(signing.generate_key(bytes([4]) * 32))]
        ),
        "lowercase",
    ),
    "principal-space": (
        changed(
            "principals.admin 4", [signing.public_key_b64(signing.generate_key(bytes([4]) * 32))]
        ),
        "lowercase",
    ),
    "principal-reserved-legacy": (
        changed(
            "principals.legacy-hmac",
            [signing.public_key_b64(signing.generate_key(bytes([4]) * 32))],
        ),
        "reserved",
    ),
    "principal-without-keys": (changed("principals.admin3", []), "at least one"),
    "key-not-base64url": (changed("principals.admin2", ["not/base64+"]), "base64url"),
    "key-wrong-length": (changed("principals.admin2", [b64url_encode(bytes(31))]), "32 raw"),
    "unknown-operation": (
        changed("operations.model-delete", {"threshold": 1, "principals": ["admin1"]}),
        "unknown operation",
    ),
    "undefined-principal-in-operation": (
        changed("operations.task-cancel.principals", ["admin9"]),
        "undefined",
    ),
    "principal-twice-in-operation": (
        changed("operations.task-cancel.principals", ["admin1", "admin1"]),
        "twice",
    ),
    "legacy-with-threshold-2": (changed("operations.model-load.legacy", True), "legacy"),
    "legacy-not-bool": (changed("operations.cache-flush.legacy", "yes"), "legacy"),
    "unknown-operation-field": (changed("operations.cache-flush.m", 1), "unknown fields"),
    "unknown-top-field": (changed("admins", []), "unknown fields"),
    "missing-issuer": (changed("issuer", None), "missing"),
    "empty-issuer": (changed("issuer", ""), "issuer"),
    "negative-epoch": (changed("policyEpoch", -1), "policyEpoch"),
    "expires-not-utc": (changed("expires", "2027-12-31T00:00:00+02:00"), "expires"),
    "expires-garbage": (changed("expires", "next year"), "expires"),
    "no-principals": (changed("principals", {}), "principals"),
    "no-operations": (changed("operations", {}), "operations"),
}


@pytest.mark.parametrize("name", sorted(UNSAFE))
def test_registry_refuses_unsafe(name: str) -> None:
    """Each unsafe registry is refused with a message that names the problem."""
    doc, fragment = UNSAFE[name]
    with pytest.raises(RegistryInvalid) as info:
        parse_registry(json.dumps(doc))
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "text", ['{"issuer": "a", "issuer": "b"}', "[]", "not json", '{"policyEpoch": NaN}']
)
def test_registry_refuses_non_strict_json(text: str) -> None:
    """Duplicate keys, non-objects, garbage and NaN are refused before any field is read."""
    with pytest.raises(RegistryInvalid):
        parse_registry(text)


def test_registry_load_names_the_file(tmp_path: Path) -> None:
    """A missing or unsafe file is refused with its path in the message."""
    with pytest.raises(RegistryInvalid, match=r"missing\.json"):
        load_registry(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(changed("operations.model-load.threshold", 0)))
    with pytest.raises(RegistryInvalid, match=r"bad\.json.*threshold 0"):
        load_registry(bad)


def test_registry_indexes_keys_by_sha256_kid() -> None:
    """Key ids are sha256 of the raw key; rotation keeps two keys under one principal."""
    registry = parse_registry(json.dumps(registry_doc()))
    kid = key_id(signing.raw_public_key(A1))
    assert kid == signing.kid_of(A1) and len(kid) == 64
    assert registry.keys[kid].principal == "admin1"
    assert len(registry.principals["admin1"]) == 2
    assert registry.operations["cache-flush"].legacy
    assert not registry.expired(NOW) and registry.expired(registry.expires_at)


def test_registry_dev_copy_is_valid() -> None:
    """keys/registry.dev.json loads and matches the thresholds of the issues (adapter
    loads and unloads, like model ones, need 2 of 3)."""
    registry = load_registry(KEYS_DIR / "registry.dev.json")
    assert registry.issuer == "gov-dev"
    assert {op: p.threshold for op, p in registry.operations.items()} == {
        "model-load": 2,
        "model-unload": 2,
        "cache-flush": 1,
        "task-cancel": 1,
        "tenant-policy": 2,
        "adapter-load": 2,
        "adapter-unload": 2,
    }
    assert [op for op, p in registry.operations.items() if p.legacy] == ["cache-flush"]
    for name in ("admin1", "admin2", "admin3"):
        pub = (KEYS_DIR / f"{name}.pub").read_text().strip()
        key = signing.load_private_key((KEYS_DIR / f"{name}.key").read_bytes())
        assert signing.public_key_b64(key) == pub
        assert registry.principals[name] == (signing.kid_of(key),)
