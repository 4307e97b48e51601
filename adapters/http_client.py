"""A lean HTTP/1.1 client for the data path: keep-alive pool, httptools parser.

Why not aiohttp or httpx: the data path must be close to invisible. Measured
here through the runner at 16 concurrent clients, aiohttp's client cost about
240 us of CPU per request (httpx far more); this client does the same job,
POST a JSON body and read back a JSON or streamed answer, for a fraction of
that. It does only what engines need: one request per connection at a time,
Content-Length or chunked bodies, keep-alive reuse, and timeouts.

Streaming: each body chunk the engine sends is handed on as it is parsed
(chunked framing removed), never merged with the next one by this client.
Back-pressure: reading from the engine pauses while more than
`_HIGH_WATER` bytes wait to be taken.

An engine may listen on a Unix domain socket instead of a TCP port
(adapters/engine_urls.py): `EngineConnections` then connects to the socket (the requests
are the same bytes, `Host: localhost`).

Failures are this module's own `ClientFailure` subclasses, and `translate_failure`
below is the one place they become engine errors (adapters/errors.py): the request
front-end calls it once around a whole exchange, and nothing else sees them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import cast
from urllib.parse import urlsplit

import httptools

from adapters.engine_urls import split_unix
from adapters.errors import (
    EngineBadResponse,
    EngineCrashed,
    EngineError,
    EngineTimeout,
    EngineUnavailable,
)

_HIGH_WATER = 1 << 20


class ClientFailure(Exception):
    """Talking to the engine failed."""


class ConnectFailed(ClientFailure):
    """No connection could be made (refused, unreachable, connect timeout)."""


class ConnectionDropped(ClientFailure):
    """The engine closed the connection before the answer was complete."""


class ResponseTimeout(ClientFailure):
    """The engine sent nothing for longer than the read timeout."""


class ProtocolFailure(ClientFailure):
    """The engine's answer is not valid HTTP/1.1."""


def translate_failure(
    exc: ClientFailure, model: str, engine_failure: str | None = None
) -> EngineError:
    """Map a failure talking to `model`'s engine to an engine error.

    `engine_failure` is the supervisor's account when the engine process died: the
    client then hears that (exit code or signal included), not a bare connection error.
    """
    if engine_failure is not None:
        return EngineCrashed(f"engine for model {model!r} {engine_failure}")
    if isinstance(exc, ResponseTimeout):
        return EngineTimeout(f"engine for model {model!r} did not answer in time")
    if isinstance(exc, ConnectFailed):
        return EngineUnavailable(f"engine for model {model!r} is unreachable")
    if isinstance(exc, ConnectionDropped):
        return EngineUnavailable(f"engine for model {model!r} closed the connection")
    if isinstance(exc, ProtocolFailure):
        return EngineBadResponse(f"engine for model {model!r} sent an invalid HTTP response")
    return EngineUnavailable(f"engine for model {model!r} failed: {exc}")


class _Connection(asyncio.Protocol):
    """One TCP connection to an engine, carrying one exchange at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.deadline = 0.0  # of the current wait (loop time)
        self.timer: asyncio.TimerHandle | None = None  # for the earliest deadline (`wait`)
        self.reset()

    def reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.keep_alive = False
        self.complete = False
        self.received_any = False
        self.parts: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.error: ClientFailure | None = None
        self.waiter: asyncio.Future[None] | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ProtocolFailure(f"invalid HTTP from engine: {exc}"))
            self.close()

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timer()
        if not self.complete and self.headers_done and self._ends_at_eof():
            self.on_message_complete()
        elif not self.complete:
            self._fail(ConnectionDropped("engine closed the connection"))

    def _ends_at_eof(self) -> bool:
        """A body with neither Content-Length nor chunked framing ends when the connection does."""
        names = {k for k, _ in self.headers}
        return b"content-length" not in names and b"transfer-encoding" not in names

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()  # only valid before the body
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # helpers
    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, error: ClientFailure) -> None:
        if self.error is None:
            self.error = error
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Wait for the next parser event (headers, a body chunk, the end, an error); fail
        with `ResponseTimeout` if none comes within `timeout`. No timer per wait: the
        connection keeps one, set for the earliest deadline it may have to meet; fired
        before the current wait's deadline, it moves on to that deadline (or stops)."""
        loop = self.loop
        self.waiter = waiter = loop.create_future()
        self.deadline = deadline = loop.time() + timeout
        if self.timer is None or deadline < self.timer.when():
            self._arm(deadline)
        try:
            await waiter
        finally:
            self.waiter = None

    def _arm(self, at: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_at(at, self._timer_fired)

    def _timer_fired(self) -> None:
        self.timer = None
        waiter = self.waiter
        if waiter is None or waiter.done() or self.closed:
            return  # nobody waits: the next wait sets the timer again
        if self.loop.time() >= self.deadline:
            self._fail(ResponseTimeout("engine sent nothing within the read timeout"))
        else:
            self._arm(self.deadline)

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def take(self) -> bytes:
        data = b"".join(self.parts) if len(self.parts) != 1 else self.parts[0]
        self.parts.clear()
        self.buffered = 0
        self._resume()
        return data

    def take_one(self) -> bytes:
        chunk = self.parts.popleft()
        self.buffered -= len(chunk)
        self._resume()
        return chunk

    def _resume(self) -> None:
        if self.paused and self.buffered <= _HIGH_WATER // 2 and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and self.error is None

    def close(self) -> None:
        self.closed = True
        self._stop_timer()
        if self.transport is not None:
            self.transport.close()


class Response:
    """The engine's answer. Always end with `release()` (or use `async with`)."""

    __slots__ = ("_conn", "_pool", "_timeout", "headers", "status")

    def __init__(self, conn: _Connection, pool: EngineConnections, timeout: float) -> None:
        self._conn = conn
        self._pool = pool
        self._timeout = timeout
        self.status = conn.status
        self.headers = conn.headers

    def header(self, name: bytes, default: bytes) -> bytes:
        for k, v in self.headers:
            if k == name:
                return v
        return default

    async def read(self) -> bytes:
        """The whole body."""
        conn = self._conn
        while not conn.complete:
            if conn.error is not None:
                raise conn.error
            await conn.wait(self._timeout)
        if conn.error is not None and not conn.complete:
            raise conn.error
        return conn.take()

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body chunks as the engine sent them."""
        conn = self._conn
        while True:
            while conn.parts:
                yield conn.take_one()
            if conn.complete:
                return
            if conn.error is not None:
                raise conn.error
            await conn.wait(self._timeout)

    def release(self) -> None:
        """Give the connection back to the pool if it can carry another exchange, else close it."""
        self._pool.give_back(self._conn)

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()


class EngineConnections:
    """Keep-alive connections to one engine (host, port)."""

    def __init__(
        self,
        url: str,
        connect_timeout: float,
        read_timeout: float,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """`headers` go on every request (e.g. the engine's `Authorization: Bearer <key>`);
        `url` is `http://host:port[/prefix]` or a `unix_url`."""
        self.uds, url = split_unix(url)
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"engine url must be http://host:port, got {url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/").encode()
        host_header = parts.netloc.encode()
        self._head = b"Host: " + host_header + b"\r\nContent-Type: application/json\r\n"
        for name, value in (headers or {}).items():
            self._head += f"{name}: {value}\r\n".encode("latin-1")
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()

    async def post(self, path: str, body: bytes, head: bytes = b"") -> Response:
        """Send a JSON POST (`head`: more header lines) and wait for the response headers."""
        request = b"".join(
            (
                b"POST ",
                self.prefix,
                path.encode(),
                b" HTTP/1.1\r\n",
                self._head,
                head,
                b"Content-Length: %d\r\n\r\n" % len(body),
                body,
            )
        )
        conn, reused = await self._acquire()
        try:
            return await self._exchange(conn, request)
        except ConnectionDropped:
            if not reused or conn.received_any:
                raise
        # A kept-alive connection the engine had already closed: retry once on a new one.
        conn, _ = await self._acquire(fresh=True)
        return await self._exchange(conn, request)

    async def _exchange(self, conn: _Connection, request: bytes) -> Response:
        try:
            assert conn.transport is not None
            conn.transport.write(request)
            while not conn.headers_done:
                if conn.error is not None:
                    raise conn.error
                await conn.wait(self.read_timeout)
        except BaseException:
            self._discard(conn)
            raise
        return Response(conn, self, self.read_timeout)

    async def _acquire(self, fresh: bool = False) -> tuple[_Connection, bool]:
        idle = self._idle
        while idle and not fresh:
            conn = idle.pop()
            if not conn.closed:
                conn.reset()
                return conn, True
            self._all.discard(conn)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                if self.uds is not None:
                    _, proto = await loop.create_unix_connection(
                        lambda: _Connection(loop), self.uds
                    )
                else:
                    _, proto = await loop.create_connection(
                        lambda: _Connection(loop), self.host, self.port
                    )
        except TimeoutError:
            raise ConnectFailed(f"connect to {self._where} timed out") from None
        except OSError as exc:
            raise ConnectFailed(f"connect to {self._where} failed: {exc}") from None
        self._all.add(proto)
        return proto, False

    @property
    def _where(self) -> str:
        return self.uds if self.uds is not None else f"{self.host}:{self.port}"

    def give_back(self, conn: _Connection) -> None:
        if conn.reusable():
            self._idle.append(conn)
        else:
            self._discard(conn)

    def _discard(self, conn: _Connection) -> None:
        conn.close()
        self._all.discard(conn)

    def close(self) -> None:
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()
