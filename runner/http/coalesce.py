"""One send() per response: writes made in one event-loop step leave as one.

uvicorn writes a response's status line and headers at `http.response.start`
and the body at `http.response.body`: two `send()` system calls for every
JSON answer. On loopback and in containers a socket write is the single most
expensive thing the runner does (profiled at 16 concurrent clients: 42% of the
runner's CPU was in `write`, more than half of it for those header writes).
`CoalescingTransport` gathers every write made during one step of the event
loop and sends them together at the end of the step, so headers and body go
out in one write. Nothing waits longer than the current step, so streamed
chunks are not delayed; order is kept; `close()` sends what is pending first.

The response head is uvicorn's own (`RequestResponseCycle.send`). A cycle of our own that
checked all names in one search was tried (cdd6e9d) and taken out again: it cost more
instructions per request than uvicorn's, and swapping each cycle's class to it cost more
still (docs/benchmarks.md, "Data path: runner CPU per request, fourth pass").
"""

from __future__ import annotations

import asyncio
from typing import Any

from runner.http.uvicorn_seam import HttpToolsProtocol


class CoalescingTransport:
    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def _flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        self._pending = []
        if self._transport.is_closing():
            return
        self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def is_closing(self) -> bool:  # once per response (uvicorn): not through __getattr__
        return self._transport.is_closing()

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending = []
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol (private: runner/http/uvicorn_seam.py), writing through a
    `CoalescingTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        wrapped = CoalescingTransport(transport, self.loop)
        super().connection_made(wrapped)  # type: ignore[arg-type]
