"""The audit log's key and its signed head, and the stores that keep the head off the log.

The runner signs every audit record and, after each one, a head: how many records the log
holds and the hash of the last (after Certificate Transparency's signed tree heads). The
head is kept where the log is not (the state store: Redis when `REDIS_URL` is set, else
the process's memory) and published in `/v1/capabilities`, so a log that was edited,
reordered, re-chained or cut at the end no longer ends where its head says.

The key (`GOVERNANCE_AUDIT_KEY`, an Ed25519 PKCS#8 PEM file) is never in the log; its
public half is published (`publicKey` in capabilities' `{"governance": {"audit": ...}}`) and goes to
`quorum audit verify --key`. A store that cannot answer raises AuditUnavailable (503).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import redis.asyncio as aioredis
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from redis.exceptions import RedisError

from faults.redis_clients import redis_client
from governance.encoding import b64url_decode, b64url_encode
from governance.errors import AuditUnavailable, ConfigInvalid, GovernanceError
from governance.registry import key_id

RECORD_CONTEXT = b"quorum-audit-record-v1\n"
"""Prefix of the bytes a record's `sig` covers (never valid as a head's, or a token's)."""
HEAD_CONTEXT = b"quorum-audit-head-v1\n"
"""Prefix of the bytes a head's `sig` covers."""


def canonical_bytes(body: Mapping[str, object]) -> bytes:
    """How records and heads are written and signed: sorted keys, no spaces."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), default=str).encode("utf-8")


class AuditKey:
    """The runner's audit signing key (private half in memory only)."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        raw = key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.public_key = b64url_encode(raw)
        self.kid = key_id(raw)

    @classmethod
    def load(cls, path: str | Path) -> AuditKey:
        """From a PKCS#8 PEM file (`quorum token keygen` makes one); ConfigInvalid if not."""
        try:
            key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
        except OSError as exc:
            raise ConfigInvalid(f"audit key {path}: cannot read: {exc.strerror}") from exc
        except ValueError as exc:
            raise ConfigInvalid(f"audit key {path}: not a PEM private key") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigInvalid(f"audit key {path}: not an Ed25519 key")
        return cls(key)

    @classmethod
    def generate(cls) -> AuditKey:
        """A key for this process only (a log kept in memory: development)."""
        return cls(Ed25519PrivateKey.generate())

    def sign(self, context: bytes, body: Mapping[str, object]) -> str:
        return b64url_encode(self._key.sign(context + canonical_bytes(body)))

    def published(self) -> dict[str, str]:
        return {"algorithm": "Ed25519", "keyId": self.kid, "publicKey": self.public_key}


def public_key_from(text: str) -> Ed25519PublicKey:
    """A public key as published (base64url of the raw 32 bytes); ValueError if not one."""
    try:
        raw = b64url_decode(text.strip())
    except ValueError:
        raise ValueError("not base64url") from None
    if len(raw) != 32:
        raise ValueError("not a raw 32-byte Ed25519 public key")
    return Ed25519PublicKey.from_public_bytes(raw)


def kid_of(public: Ed25519PublicKey) -> str:
    return key_id(public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


def signature_holds(
    public: Ed25519PublicKey, context: bytes, body: Mapping[str, object], sig: str
) -> bool:
    try:
        public.verify(b64url_decode(sig), context + canonical_bytes(body))
    except (InvalidSignature, ValueError):
        return False
    return True


@dataclass(frozen=True)
class Head:
    """How many records the log holds and the hash of the last, signed by the audit key."""

    runner_id: str
    count: int
    last_hash: str
    time: float
    kid: str
    public_key: str
    sig: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "runnerId": self.runner_id,
            "count": self.count,
            "lastHash": self.last_hash,
            "time": self.time,
            "kid": self.kid,
            "publicKey": self.public_key,
            "sig": self.sig,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> Head:
        """ValueError naming the field when `doc` is not a head."""
        texts = {n: doc.get(n) for n in ("runnerId", "lastHash", "kid", "publicKey", "sig")}
        count, time = doc.get("count"), doc.get("time")
        for name, value in texts.items():
            if not isinstance(value, str):
                raise ValueError(f"a head needs `{name}` (a string)")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError("a head needs `count` (an integer >= 0)")
        if not isinstance(time, (int, float)) or isinstance(time, bool):
            raise ValueError("a head needs `time` (a number)")
        runner_id, last_hash, kid, public_key, sig = (str(v) for v in texts.values())
        return cls(runner_id, count, last_hash, float(time), kid, public_key, sig)

    def unsigned(self) -> dict[str, object]:
        body = self.to_json()
        del body["sig"]
        return body


def sign_head(key: AuditKey, runner_id: str, count: int, last_hash: str, time: float) -> Head:
    head = Head(runner_id, count, last_hash, time, key.kid, key.public_key)
    return Head(**{**asdict(head), "sig": key.sign(HEAD_CONTEXT, head.unsigned())})


class HeadStore(Protocol):
    async def put(self, head: Head) -> None:
        """Keep `head` as its runner's latest, or raise AuditUnavailable."""
        ...

    async def get(self, runner_id: str) -> Head | None:
        """The runner's latest head (None: none kept), or raise AuditUnavailable."""
        ...

    async def aclose(self) -> None: ...


class MemoryHeadStore:
    """Heads in this process (one replica, nothing across restarts: development)."""

    def __init__(self) -> None:
        self._heads: dict[str, Head] = {}

    async def put(self, head: Head) -> None:
        self._heads[head.runner_id] = head

    async def get(self, runner_id: str) -> Head | None:
        return self._heads.get(runner_id)

    async def aclose(self) -> None:
        return None


class RedisHeadStore:
    """Heads in Redis, one key per runner: `SET <prefix><runner id> <head JSON>`."""

    def __init__(self, client: aioredis.Redis, prefix: str = "quorum:gov:audit-head:") -> None:
        self._client = client
        self._prefix = prefix

    @classmethod
    def from_url(cls, url: str, timeout_s: float = 2.0) -> RedisHeadStore:
        return cls(redis_client(url, timeout_s))

    def key(self, runner_id: str) -> str:
        return self._prefix + runner_id

    async def put(self, head: Head) -> None:
        try:
            await self._client.set(self.key(head.runner_id), canonical_bytes(head.to_json()))
        except (RedisError, OSError) as exc:
            raise _unavailable(exc) from exc

    async def get(self, runner_id: str) -> Head | None:
        try:
            raw = await self._client.get(self.key(runner_id))
        except (RedisError, OSError) as exc:
            raise _unavailable(exc) from exc
        if raw is None:
            return None
        try:
            return Head.from_json(json.loads(raw))
        except (ValueError, AttributeError) as exc:
            raise AuditUnavailable(f"the audit head kept for {runner_id} is unreadable") from exc

    async def aclose(self) -> None:
        await self._client.aclose()


def _unavailable(exc: BaseException) -> GovernanceError:
    return AuditUnavailable(
        f"audit head store unreachable ({type(exc).__name__}); lifecycle operations are "
        "refused until it is back"
    )
