"""Build a Verifier from settings: the one place the runner wires governance together."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from faults.redis_wait import AUTO, ReplicasSetting
from governance.audit import AuditSink, FileAuditSink, MemoryAuditSink
from governance.audit_heads import AuditKey, HeadStore, MemoryHeadStore, RedisHeadStore
from governance.errors import ConfigInvalid
from governance.nonces import MemoryNonceStore, NonceStore, RedisNonceStore, SqliteNonceStore
from governance.registry import load_registry
from governance.verifier import Verifier

MIN_LEGACY_KEY_BYTES = 32


def load_legacy_key(path: str | Path) -> bytes:
    """The legacy HMAC key: the file's bytes without surrounding whitespace, >= 32 bytes."""
    try:
        key = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ConfigInvalid(f"legacy HMAC key {path}: cannot read: {exc.strerror}") from exc
    if len(key) < MIN_LEGACY_KEY_BYTES:
        raise ConfigInvalid(f"legacy HMAC key {path}: shorter than {MIN_LEGACY_KEY_BYTES} bytes")
    return key


def build_verifier(
    registry_path: str,
    runner_id: str,
    redis_url: str | None = None,
    legacy_key_path: str | None = None,
    audit_path: str | None = None,
    clock: Callable[[], float] = time.time,
    audit_key_path: str | None = None,
    state_db: str | None = None,
    state_db_sync: str = "full",
    nonce_replicas: ReplicasSetting = AUTO,
    nonce_replicas_timeout_ms: int = 500,
) -> Verifier:
    """Load and check everything now; raise ConfigInvalid (refuse to start) on any problem.

    - registry_path: GOVERNANCE_REGISTRY (validated; unsafe registries are refused).
    - redis_url: REDIS_URL: nonces shared by every replica; without it nonces are spent
      in `state_db` (STATE_DB, a SQLite file: they survive a restart), or, when that is
      None too, in process memory (single replica, forgotten at a restart);
      `state_db_sync`: STATE_DB_SYNC (faults/state_db.py); `nonce_replicas`: NONCE_REPLICAS,
      the Redis replicas that must acknowledge a spend within `nonce_replicas_timeout_ms`
      (`auto`: 1 where the primary has replicas, faults/redis_wait.py).
    - legacy_key_path: VERIFIED_OP_TOKEN_KEY_PATH; None leaves the legacy HMAC form off.
    - audit_path: the append-only JSONL audit log; None keeps records in memory (dev only).
    - audit_key_path: GOVERNANCE_AUDIT_KEY, the Ed25519 key that signs records and heads;
      required with an audit_path (a file signed by a key that dies with the process could
      not be checked after a restart); None with no audit_path: a key for this process.
    Heads go to Redis with redis_url, else to process memory.
    Call `await verifier.aclose()` at shutdown to close the Redis client and the log file.
    """
    if not runner_id:
        raise ConfigInvalid("a runner id is required: tokens are addressed to it (aud)")
    registry = load_registry(registry_path)
    legacy_key = load_legacy_key(legacy_key_path) if legacy_key_path else None
    nonces: NonceStore
    if redis_url:
        nonces = RedisNonceStore.from_url(
            redis_url, replicas=nonce_replicas, timeout_ms=nonce_replicas_timeout_ms
        )
    elif state_db:
        try:
            nonces = SqliteNonceStore(state_db, clock, state_db_sync)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigInvalid(f"state db {state_db}: cannot open: {exc}") from exc
    else:
        nonces = MemoryNonceStore(clock)
    if audit_key_path:
        key = AuditKey.load(audit_key_path)
    elif audit_path:
        raise ConfigInvalid(
            f"audit log {audit_path} needs GOVERNANCE_AUDIT_KEY, the key that signs it"
        )
    else:
        key = AuditKey.generate()
    heads: HeadStore = RedisHeadStore.from_url(redis_url) if redis_url else MemoryHeadStore()
    audit: AuditSink
    if audit_path:
        sink = FileAuditSink(audit_path, key, heads)
        try:
            sink.probe()
        except OSError as exc:
            raise ConfigInvalid(f"audit log {audit_path}: cannot open: {exc.strerror}") from exc
        audit = sink
    else:
        audit = MemoryAuditSink(key=key, heads=heads)
    return Verifier(registry, nonces, audit, runner_id, clock, legacy_key=legacy_key)
