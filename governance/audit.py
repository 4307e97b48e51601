"""The audit log: one record per lifecycle decision, written before anything runs.

Records hold who approved what (principals, key ids, a SHA-256 of the nonce) and never
token or key material. A sink that cannot write raises AuditUnavailable (503).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from governance.errors import AuditUnavailable


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

    def to_json(self) -> str:
        body = asdict(self)
        body["params"] = dict(self.params)
        return json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)


class AuditSink(Protocol):
    async def append(self, record: AuditRecord) -> None:
        """Durably append one record, or raise AuditUnavailable."""
        ...

    async def aclose(self) -> None: ...


class MemoryAuditSink:
    """Keeps the last `maxlen` records in memory (tests, benchmarks, dev without a path)."""

    def __init__(self, maxlen: int = 10_000) -> None:
        self.records: deque[AuditRecord] = deque(maxlen=maxlen)

    async def append(self, record: AuditRecord) -> None:
        self.records.append(record)

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

    def probe(self) -> None:
        """Open the file now (at start-up) so a bad path fails early; raises OSError."""
        with self._lock:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    async def append(self, record: AuditRecord) -> None:
        line = (record.to_json() + "\n").encode("utf-8")
        try:
            await asyncio.to_thread(self._write, line)
        except OSError as exc:
            raise AuditUnavailable(
                f"audit log {self.path} is not writable ({exc.strerror or exc}); "
                "lifecycle operations are refused until it is"
            ) from exc

    def _write(self, line: bytes) -> None:
        with self._lock:
            self._write_locked(line)

    def _write_locked(self, line: bytes) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
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
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    async def aclose(self) -> None:
        with self._lock:
            self._close()
