"""The audit log: one record per lifecycle decision, written before anything runs.

Records hold who approved what (principals, key ids, a SHA-256 of the nonce) and never
token or key material. A sink that cannot write raises AuditUnavailable (503).

Tamper-evident (after Vault's audit devices and Certificate Transparency's signed heads):
- each line carries `prev`, the SHA-256 (hex) of the line before it as written (without
  its newline; the first line's `prev` is GENESIS), and `seq`, its 1-based position;
- each line carries `kid` and `sig`: the runner's audit key (`governance/audit_heads.py`,
  never in the log) signs the line's other fields, `prev` and `seq` included, so a record
  cannot be edited, moved or re-chained without the key;
- after each record a signed head (count, last hash) goes to the head store, which is not
  where the log is, so a log cut at the end no longer reaches its head.
`quorum audit verify FILE --head ...` (`governance/audit_verify.py`) checks all three.
A file appended to across restarts continues its chain and count: the sink reads the last
line when it opens the file, and refuses to write (503) when the log no longer reaches
the head kept for it (records removed or rewritten while the runner was down).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from governance.audit_heads import (
    RECORD_CONTEXT,
    AuditKey,
    Head,
    HeadStore,
    canonical_bytes,
    sign_head,
)
from governance.errors import AuditUnavailable

GENESIS = "0" * 64
"""The `prev` of a log's first record."""


def line_hash(line: bytes) -> str:
    """What the next record's `prev` holds: SHA-256 of the line, without its newline."""
    return hashlib.sha256(line.rstrip(b"\n")).hexdigest()


@dataclass(frozen=True)
class AuditRecord:
    time: float
    runner_id: str
    operation: str
    model_id: str | None
    params: Mapping[str, object]
    outcome: str  # "approved" | "rejected"
    reason: str  # "ok" or the error code
    status: int
    principals: tuple[str, ...] = ()
    key_ids: tuple[str, ...] = ()
    nonce_sha256: str | None = None
    detail: str = ""
    extra: Mapping[str, object] = field(default_factory=dict)

    def to_json(self, prev: str = GENESIS, seq: int = 1, key: AuditKey | None = None) -> str:
        """The record's line: chained to the one before by `prev`, numbered `seq`, and
        signed by `key` (`kid`, `sig`) when there is one."""
        body = json.loads(canonical_bytes({**asdict(self), "params": dict(self.params)}))
        body["prev"] = prev
        body["seq"] = seq
        if key is not None:
            body["kid"] = key.kid
            body["sig"] = key.sign(RECORD_CONTEXT, body)
        return canonical_bytes(body).decode("utf-8")


class AuditSink(Protocol):
    async def append(self, record: AuditRecord) -> None:
        """Durably append one record, or raise AuditUnavailable."""
        ...

    def published(self) -> dict[str, object] | None:
        """The audit key's public half and the latest head, as capabilities publish them
        (None: records are not signed)."""
        ...

    async def aclose(self) -> None: ...


class _Signed:
    """What both sinks share: the key, the head store, and the latest head."""

    def __init__(self, key: AuditKey | None, heads: HeadStore | None) -> None:
        self.key = key
        self.heads = heads
        self.head: Head | None = None

    async def _publish_head(self, runner_id: str, count: int, last_hash: str, now: float) -> None:
        if self.key is None:
            return
        head = sign_head(self.key, runner_id, count, last_hash, now)
        if self.heads is not None:
            await self.heads.put(head)
        self.head = head

    def published(self) -> dict[str, object] | None:
        if self.key is None:
            return None
        return {**self.key.published(), "head": self.head.to_json() if self.head else None}


class MemoryAuditSink(_Signed):
    """Keeps the last `maxlen` records in memory (tests, benchmarks, dev without a path),
    and the chain's last hash and count as a file would."""

    def __init__(
        self, maxlen: int = 10_000, key: AuditKey | None = None, heads: HeadStore | None = None
    ) -> None:
        super().__init__(key, heads)
        self.records: deque[AuditRecord] = deque(maxlen=maxlen)
        self.last_hash = GENESIS
        self.count = 0
        self._lock = asyncio.Lock()

    async def append(self, record: AuditRecord) -> None:
        async with self._lock:
            line = record.to_json(self.last_hash, self.count + 1, self.key)
            self.records.append(record)
            self.count += 1
            self.last_hash = line_hash(line.encode("utf-8"))
            await self._publish_head(record.runner_id, self.count, self.last_hash, record.time)

    async def aclose(self) -> None:
        if self.heads is not None:
            await self.heads.aclose()


class FileAuditSink(_Signed):
    """Append-only JSON Lines: O_APPEND, one write per line, flush and fsync per record,
    then the signed head to the head store (one record at a time).

    The write runs in a worker thread so a slow disk never stalls the event loop.
    """

    def __init__(
        self, path: str | Path, key: AuditKey | None = None, heads: HeadStore | None = None
    ) -> None:
        super().__init__(key, heads)
        self.path = Path(path)
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._order = asyncio.Lock()  # one record and its head at a time
        self._last: tuple[str, int] | None = None  # last hash and count, read at open
        self._reaches_head = False

    def probe(self) -> None:
        """Open the file now (at start-up) so a bad path fails early; raises OSError."""
        with self._lock:
            self._open()

    def _open(self) -> tuple[str, int]:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        if self._last is None:
            self._last = _tail_state(self.path)
        return self._last

    async def append(self, record: AuditRecord) -> None:
        async with self._order:
            try:
                if not self._reaches_head:
                    await self._check_head(record.runner_id)
                last_hash, count = await asyncio.to_thread(self._write, record)
            except OSError as exc:
                raise AuditUnavailable(
                    f"audit log {self.path} is not writable ({exc.strerror or exc}); "
                    "lifecycle operations are refused until it is"
                ) from exc
            await self._publish_head(record.runner_id, count, last_hash, record.time)

    async def _check_head(self, runner_id: str) -> None:
        """Refuse to extend a log that no longer reaches the head kept for it."""
        last_hash, count = await asyncio.to_thread(self._opened)
        kept = await self.heads.get(runner_id) if self.heads is not None else None
        if kept is not None and (
            kept.count > count or (kept.count == count and kept.last_hash != last_hash)
        ):
            raise AuditUnavailable(
                f"audit log {self.path} holds {count} records but its signed head says "
                f"{kept.count} (records removed or rewritten); lifecycle operations are "
                "refused: check it with `quorum audit verify` (docs/governance.md)"
            )
        self._reaches_head = True

    def _opened(self) -> tuple[str, int]:
        with self._lock:
            return self._open()

    def _write(self, record: AuditRecord) -> tuple[str, int]:
        with self._lock:
            last_hash, count = self._open()
            line = record.to_json(last_hash, count + 1, self.key).encode("utf-8")
            self._write_locked(line + b"\n")
            self._last = (line_hash(line), count + 1)
            return self._last

    def _write_locked(self, line: bytes) -> None:
        assert self._fd is not None
        try:
            view = memoryview(line)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            os.fsync(self._fd)
        except OSError:
            self._close()
            raise

    def _close(self) -> None:
        self._last = None  # read again from the file when it reopens
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    async def aclose(self) -> None:
        with self._lock:
            self._close()
        if self.heads is not None:
            await self.heads.aclose()


def _tail_state(path: Path) -> tuple[str, int]:
    """The hash of the file's last complete line and the records it holds: the last
    line's `seq`, or (a log written before records were numbered) its lines counted.
    An empty or new file: (GENESIS, 0)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            step = 4096
            tail = b""
            while size > 0 and tail.count(b"\n") < 2:
                read = min(step, size)
                size -= read
                f.seek(size)
                tail = f.read(read) + tail
    except FileNotFoundError:
        return GENESIS, 0
    lines = [line for line in tail.split(b"\n") if line]
    if not lines:
        return GENESIS, 0
    try:
        seq = json.loads(lines[-1]).get("seq")
    except (ValueError, AttributeError):
        seq = None
    if not isinstance(seq, int) or isinstance(seq, bool):
        with open(path, "rb") as f:
            seq = sum(1 for line in f if line.strip())
    return line_hash(lines[-1]), seq
