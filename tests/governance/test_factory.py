"""build_verifier: settings in, a working Verifier out, or a refusal to start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from governance.audit import FileAuditSink, MemoryAuditSink
from governance.audit_heads import RedisHeadStore
from governance.errors import ConfigInvalid, RegistryInvalid
from governance.factory import build_verifier
from governance.nonces import MemoryNonceStore, RedisNonceStore
from tests.governance.support import (
    LEGACY_KEY,
    MODEL,
    OPERATION,
    PARAMS,
    RUNNER,
    Clock,
    registry_doc,
    token,
)
from tests.support.redis_server import RedisServer
from tests.support.tokens import DEV_AUDIT_KEY


@pytest.fixture
def registry_path(tmp_path: Path) -> str:
    path = tmp_path / "registry.json"
    path.write_text(json.dumps(registry_doc()))
    return str(path)


async def test_factory_defaults_to_memory_stores(registry_path: str) -> None:
    """Without Redis or an audit path, nonces and audit stay in memory and tokens verify."""
    verifier = build_verifier(registry_path, RUNNER, clock=Clock())
    assert isinstance(verifier.nonce_store, MemoryNonceStore)
    assert isinstance(verifier.audit_sink, MemoryAuditSink)
    assert (await verifier.authorize(token(), OPERATION, MODEL, PARAMS)).principals
    await verifier.aclose()


async def test_factory_wires_redis_audit_file_and_legacy(
    registry_path: str, tmp_path: Path, redis_server: RedisServer
) -> None:
    """REDIS_URL, an audit path with its signing key and a legacy key file are all
    honoured: the record is signed and its head kept in Redis."""
    key_file = tmp_path / "legacy.key"
    key_file.write_bytes(LEGACY_KEY + b"\n")
    audit = tmp_path / "audit.jsonl"
    verifier = build_verifier(
        registry_path,
        RUNNER,
        redis_server.url,
        str(key_file),
        str(audit),
        Clock(),
        audit_key_path=str(DEV_AUDIT_KEY),
    )
    assert isinstance(verifier.nonce_store, RedisNonceStore)
    assert isinstance(verifier.audit_sink, FileAuditSink)
    assert (await verifier.authorize(token(), OPERATION, MODEL, PARAMS)).principals
    await verifier.aclose()
    record = json.loads(audit.read_text())
    assert (record["outcome"], record["seq"]) == ("approved", 1) and record["sig"]
    heads = RedisHeadStore.from_url(redis_server.url)
    kept = await heads.get(RUNNER)
    await heads.aclose()
    assert kept is not None and kept.count == 1


@pytest.mark.parametrize(
    "problem",
    [
        "registry",
        "legacy-short",
        "legacy-missing",
        "audit-dir",
        "audit-unkeyed",
        "audit-key-bad",
        "runner-id",
    ],
)
def test_factory_refuses_to_start(problem: str, registry_path: str, tmp_path: Path) -> None:
    """Unsafe registry, bad legacy key, unopenable audit log, an audit log without its
    signing key or with an unusable one, or no runner id: ConfigInvalid."""
    short = tmp_path / "short.key"
    short.write_bytes(b"too-short")
    bad_registry = tmp_path / "bad.json"
    bad_registry.write_text(json.dumps(registry_doc(policyEpoch=-1)))
    kwargs: dict[str, str] = {
        "registry": {"registry_path": str(bad_registry)},
        "legacy-short": {"legacy_key_path": str(short)},
        "legacy-missing": {"legacy_key_path": str(tmp_path / "absent.key")},
        "audit-dir": {
            "audit_path": str(tmp_path / "no" / "such" / "dir" / "audit.jsonl"),
            "audit_key_path": str(DEV_AUDIT_KEY),
        },
        "audit-unkeyed": {"audit_path": str(tmp_path / "audit.jsonl")},
        "audit-key-bad": {
            "audit_path": str(tmp_path / "audit.jsonl"),
            "audit_key_path": str(short),
        },
        "runner-id": {"runner_id": ""},
    }[problem]
    args = {"registry_path": registry_path, "runner_id": RUNNER, **kwargs}
    with pytest.raises(ConfigInvalid) as info:
        build_verifier(**args)  # type: ignore[arg-type]
    assert isinstance(info.value, RegistryInvalid) == (problem == "registry")
