"""One send() per response: writes made in one event-loop step leave as one; a response
head checked in two searches.

uvicorn writes a response's status line and headers at `http.response.start`
and the body at `http.response.body`: two `send()` system calls for every
JSON answer. On loopback and in containers a socket write is the single most
expensive thing the runner does (profiled at 16 concurrent clients: 42% of the
runner's CPU was in `write`, more than half of it for those header writes).
`CoalescingTransport` gathers every write made during one step of the event
loop and sends them together at the end of the step, so headers and body go
out in one write. Nothing waits longer than the current step, so streamed
chunks are not delayed; order is kept; `close()` sends what is pending first.

uvicorn checks a response head with two regular-expression searches per header (a name's
characters, a value's: ~0.3 us each here, ~8 us for the runner's 14 headers).
`CheckedOnceCycle` searches all the names at once and all the values at once: one
header holds a refused character exactly when their concatenation does, so the same
heads are refused with the same errors; and a head of the runner's own (names in lower
case, nothing uvicorn reads from them but a last Content-Length) is written in one pass
instead of header by header; the rest of `http.response.start` is uvicorn's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn._types import ASGISendEvent
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string


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

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending = []
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, writing through a `CoalescingTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        wrapped = CoalescingTransport(transport, self.loop)
        super().connection_made(wrapped)  # type: ignore[arg-type]


class CheckedOnceCycle(RequestResponseCycle):
    """uvicorn's request-response cycle with the head checked in two searches (see the
    module docstring); `GuardedHttpToolsProtocol` serves each request's cycle as one."""

    async def send(self, message: ASGISendEvent) -> None:
        if (
            self.response_started
            or self.disconnected
            or self.flow.write_paused
            or message["type"] != "http.response.start"
        ):
            return await _send(self, message)  # uvicorn's: the body, a wait, an error
        self.response_started = True
        self.waiting_for_100_continue = False
        status_code = message["status"]
        headers = self.default_headers + list(message.get("headers", []))
        names = b"".join([name for name, _ in headers])
        if HEADER_RE.search(names):
            raise RuntimeError("Invalid HTTP header name.")
        if HEADER_VALUE_RE.search(b"".join([value for _, value in headers])):
            raise RuntimeError("Invalid HTTP header value.")
        if self.access_log:
            self.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(self.scope),
                self.scope["method"],
                get_path_with_query_string(self.scope),
                self.scope["http_version"],
                status_code,
            )
        if _plain(names, headers):
            self.transport.write(self._plain_head(status_code, headers))
            return
        content = [STATUS_LINE[status_code]]
        has_connection_close = False
        for name, value in headers:
            name = name.lower()
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection":
                connection = [token.lower().strip() for token in value.split(b",")]
                if b"close" in connection:
                    self.keep_alive = False
                    has_connection_close = True
            content.extend([name, b": ", value, b"\r\n"])
        content.append(self._head_end(status_code, has_connection_close))
        self.transport.write(b"".join(content))

    def _plain_head(self, status_code: int, headers: list[tuple[bytes, bytes]]) -> bytes:
        """The head of `_plain` headers, as the loop above writes it, in one pass."""
        if headers and headers[-1][0] == b"content-length":
            self.expected_content_length = int(headers[-1][1].decode())
            self.chunked_encoding = False
        lines = [b"%s: %s\r\n" % h for h in headers]
        return STATUS_LINE[status_code] + b"".join(lines) + self._head_end(status_code, False)

    def _head_end(self, status_code: int, said_close: bool) -> bytes:
        """`connection: close` unless kept alive (or said), chunked framing where no length
        was given (not for HEAD, 204, 304), the blank line."""
        end = b"" if self.keep_alive or said_close else b"connection: close\r\n"
        if (
            self.chunked_encoding is None
            and self.scope["method"] != "HEAD"
            and status_code not in (204, 304)
        ):
            self.chunked_encoding = True
            end += b"transfer-encoding: chunked\r\n"
        return end + b"\r\n"


_send = RequestResponseCycle.send
_READ = (b"transfer-encoding", b"connection")


def _plain(names: bytes, headers: list[tuple[bytes, bytes]]) -> bool:
    """Headers the head's loop would write as they are and read nothing from but a last
    Content-Length (the runner's own answers): names in lower case, no Transfer-Encoding
    or Connection, Content-Length only last. (`names`, their concatenation, may hold one
    of those words across two names: then the loop writes it.)"""
    if not names.islower() or any(word in names for word in _READ):
        return False
    lengths = names.count(b"content-length")
    return lengths == 0 or (lengths == 1 and headers[-1][0] == b"content-length")
