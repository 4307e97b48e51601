"""The audit log: one record per lifecycle decision, written before anything runs.

Records hold who approved what (principals, key ids, a SHA-256 of the nonce) and never
token or key material. A sink that cannot write raises AuditUnavailable (503).

Tamper-evident (after Vault's audit devices): each line carries `prev`, the SHA-256 (hex)
of the line before it as written (without its newline; the first line's `prev` is
GENESIS), so editing, inserting or deleting a record breaks the chain at the next line.
`verify_chain` (and `quorum audit verify FILE`) finds the first line that does not follow.
A file appended to across restarts continues its chain: the sink reads the last line
when it opens the file. What a chain cannot show is a cut at the end (the last records
removed): ship the log off the host as it is written (deploy/k8s does, through a sidecar).
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

from governance.errors import AuditUnavailable

GENESIS = "0" * 64
"""The `prev` of a log's first record."""


def line_hash(line: bytes) -> str:
    """What the next record's `prev` holds: SHA-256 of the line, without its newline."""
    return hashlib.sha256(line.rstrip(b"\n")).hexdigest()


def verify_chain(lines: list[bytes]) -> tuple[int, str] | None:
    """The first line (1-based) that breaks the chain and why; None when all follow.

    1. Each line is a JSON object with a string `prev`.
    2. The first line's `prev` is GENESIS; every other's is the hash of the line before.
    """
    prev = GENESIS
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except ValueError:
            return number, "not a JSON record"
        if not isinstance(record, dict) or not isinstance(record.get("prev"), str):  # 1
            return number, "no `prev` hash"
        if record["prev"] != prev:  # 2
            before = "the start of the log" if number == 1 else f"line {number - 1}"
            return number, f"its `prev` is not the hash of {before} (edited, inserted or deleted)"
        prev = line_hash(line)
    return None


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

    def to_json(self, prev: str = GENESIS) -> str:
        """The record's line, chained to the record before it by `prev`."""
        body = asdict(self)
        body["params"] = dict(self.params)
        body["prev"] = prev
        return json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)


class AuditSink(Protocol):
    async def append(self, record: AuditRecord) -> None:
        """Durably append one record, or raise AuditUnavailable."""
        ...

    async def aclose(self) -> None: ...


class MemoryAuditSink:
    """Keeps the last `maxlen` records in memory (tests, benchmarks, dev without a path),
    and the chain's last hash as a file would."""

    def __init__(self, maxlen: int = 10_000) -> None:
        self.records: deque[AuditRecord] = deque(maxlen=maxlen)
        self.last_hash = GENESIS

    async def append(self, record: AuditRecord) -> None:
        self.records.append(record)
        self.last_hash = line_hash(record.to_json(self.last_hash).encode("utf-8"))

    async def aclose(self) -> None:
        return None


class FileAuditSink:
    """Append-only JSON Lines: O_APPEND, one write per line, flush and fsync per record.

    The write runs in a worker thread so a slow disk never stalls the event loop.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._last: str | None = None  # the chain's last hash, read when the file opens

    def probe(self) -> None:
        """Open the file now (at start-up) so a bad path fails early; raises OSError."""
        with self._lock:
            self._open()

    def _open(self) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        if self._last is None:
            self._last = _last_line_hash(self.path)

    async def append(self, record: AuditRecord) -> None:
        try:
            await asyncio.to_thread(self._write, record)
        except OSError as exc:
            raise AuditUnavailable(
                f"audit log {self.path} is not writable ({exc.strerror or exc}); "
                "lifecycle operations are refused until it is"
            ) from exc

    def _write(self, record: AuditRecord) -> None:
        with self._lock:
            self._open()
            assert self._last is not None
            line = record.to_json(self._last).encode("utf-8")
            self._write_locked(line + b"\n")
            self._last = line_hash(line)

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


def _last_line_hash(path: Path) -> str:
    """The hash of the file's last complete line (GENESIS for an empty or new file)."""
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
        return GENESIS
    lines = [line for line in tail.split(b"\n") if line]
    return line_hash(lines[-1]) if lines else GENESIS
