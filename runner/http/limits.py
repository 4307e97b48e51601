"""Slow and oversized clients: limits on what one connection may cost the runner.

A runner in a fleet faces the open network behind a gateway; without limits a 70 KB header
or 2,000 headers are parsed and kept, and a client that sends half its headers holds a
connection (and its memory) for ever. `GuardedHttpToolsProtocol` is uvicorn's httptools
protocol with coalesced writes (runner/http/coalesce.py) plus these limits (`ClientLimits`,
settings in runner/floor/settings.py, documented in docs/configuration.md):

| limit                | setting            | default | past it                             |
|----------------------|--------------------|---------|-------------------------------------|
| request head size *  | MAX_HEADER_BYTES   | 32 KiB  | 431 request_header_fields_too_large |
| header count         | MAX_HEADERS        | 100     | 431                                 |
| head read time       | HEADER_TIMEOUT_S   | 10 s    | 408 request_timeout                 |
| body silence         | BODY_TIMEOUT_S     | 30 s    | 408 (closed only, once answering)   |
| idle after an answer | KEEP_ALIVE_TIMEOUT_S | 30 s  | closed, no answer (as uvicorn's)    |
| open connections     | MAX_CONNECTIONS    | 1024    | 503 too_many_connections            |
| ... from one address | MAX_CONNECTIONS_PER_SOURCE | 256 | 429 too_many_source_connections |
| ... kept for proven clients | AUTHENTICATED_CONNECTION_SHARE | 1/8 | 503 unless proven (**) |
| the Host header      | ALLOWED_HOSTS      | loopback, IPs | 400 invalid_host (hosts.py) |
| a reader that stops  | WRITE_STALL_TIMEOUT_S | 30 s | the connection is cut (see below)   |

(*) the request target and the headers' names and values; of a head still incomplete, the
bytes read so far. (**) past the unauthenticated share, a connection's first request must
prove who sent it (a valid API key, the gateway's credentials): runner/http/reserve.py.
The connections per source address are counted by runner/http/sources.py, those kept for
authenticated clients by runner/http/reserve.py (the sweep itself is runner/http/watch.py).

The head's time counts from the connection's opening (first request) or from the
request's first byte (later requests on a kept-alive connection); a connection that sent
nothing is closed without an answer, as uvicorn closes an idle kept-alive one. The body's
time counts between chunks, and not while the runner itself stops reading (its buffer is
full, or the client waits for `100 Continue`). Every refusal is the runner's error
envelope with `Connection: close`; then the connection stops being read (what the client
still sends is discarded, for at most `LINGER_S`, so that its socket is not reset before
it reads the answer) and is closed.

A client that stops reading an answer (a stream, most of all) would hold its scheduler
slot as long as it likes: once the socket's buffers are full, writing to it pauses
(asyncio's flow control) and the handler waits. When the writes of a connection stay
paused, without one resume, for WRITE_STALL_TIMEOUT_S, the connection is aborted (its
buffered bytes dropped): the handler sees the client gone, the engine request is cancelled
and the slot released; `on_write_stall` counts it (`quorum_write_stalls_total`).

Cost on the data path: the callbacks only count (a phase, a step, the reads, the bytes of
a head) and compare (a connection on probation, past the unauthenticated share, is
identified once, at its first head; the Host is one set lookup, `hosts.HostAllowList`);
the head's exact size is summed only when the bytes read could exceed the limit; no clock
is read and no timer armed per request (uvicorn arms one per answer for its keep-alive;
here the sweep closes idle kept-alive connections). One sweep (`ConnectionWatch`, four
times per shortest timeout) notes when each connection's phase or reads last changed and
acts on those that stood still too long, so a timeout fires between its value and a
quarter more (measured: `python -m bench.http_limits`, docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import httptools

from runner.errors import (
    HeadersTooLarge,
    InvalidHost,
    QuorumError,
    RequestTimeout,
    TooManyConnections,
    TooManySourceConnections,
    error_body,
    error_headers,
    error_status,
)
from runner.http.asgi import GONE_HOOK
from runner.http.coalesce import CoalescingHttpToolsProtocol
from runner.http.hosts import HostAllowList
from runner.http.reserve import Admit, ConnectionShare, Prove
from runner.http.sources import Network, SourceCounts
from runner.http.uvicorn_seam import STATUS_LINE
from runner.http.watch import (
    BODY,
    CLOSING,
    HEAD,
    IDLE,
    KEPT,
    NEW,
    ConnectionWatch,
    Watched,
)

log = logging.getLogger("quorum.http")


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """What one client may cost (the table in the module docstring)."""

    max_header_bytes: int = 32 * 1024
    max_headers: int = 100
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 1024
    write_stall_timeout_s: float = 30.0
    keep_alive_s: float = 30.0
    max_per_source: int = 256  # 0: no cap per source address
    reserved: int = 0  # of max_connections, kept for authenticated clients
    hosts: tuple[str, ...] | None = None  # Host names answered (runner/http/hosts.py); None: any
    trusted: tuple[Network, ...] = ()  # peers not capped per source (the gateway's)

    @property
    def sweep_s(self) -> float:
        """How often deadlines are checked: a quarter of the shortest timeout, 50 ms-1 s."""
        shortest = min(
            self.header_timeout_s,
            self.body_timeout_s,
            self.write_stall_timeout_s,
            self.keep_alive_s,
        )
        return min(1.0, max(0.05, shortest / 4))


class GuardedHttpToolsProtocol(Watched, CoalescingHttpToolsProtocol):
    """uvicorn's httptools protocol (coalesced writes) under `ClientLimits`.

    Use `protocol_with(limits)`: each server gets its own subclass holding its limits and
    its `ConnectionWatch`.
    """

    limits: ClassVar[ClientLimits] = ClientLimits()
    watch: ClassVar[ConnectionWatch]
    sources: ClassVar[SourceCounts] = SourceCounts(0)
    share: ClassVar[ConnectionShare] = ConnectionShare(ClientLimits().max_connections)
    hosts: ClassVar[HostAllowList | None] = None
    stalls: ClassVar[list[Callable[[], None]]] = []  # called per write stall (metrics)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.phase = NEW
        self.step = 0  # +1 at each change of phase but the first request's NEW -> HEAD
        self.reads = 0  # data_received calls
        self.mark = (0, 0)  # (step, reads) as ConnectionWatch last saw them
        self.since = 0.0  # loop time the watch first saw `mark`
        self._head_received = 0  # bytes received while reading a head (a body's too, if
        # they came in the same read)
        self.resumes = 0  # resume_writing calls: writes that got moving again
        self.stall_mark = -1  # `resumes` when the watch first saw writes paused
        self.stalled_since = 0.0
        self._on_gone: Callable[[], None] | None = None  # the running request's watch
        self._gone_hook = self._set_on_gone  # in every request's scope (`GONE_HOOK`)
        limits = self.limits
        self._max_headers = limits.max_headers
        self._max_header_bytes = limits.max_header_bytes
        self.probation = False  # in the reserve: its first head must prove who it is
        self.proven = False
        self.was_cut = False  # cut to make room for a newcomer (`ConnectionShare`)

    # Connection events

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.since = self.loop.time()
        self.watch.start(self.loop, self.connections)
        self.source = self.client[0] if self.client else ""
        past = self.sources.opened(self.source)
        admit = self.share.opened(self, refused=past)
        if past:
            self.refuse(TooManySourceConnections(limit=self.sources.limit, retry_after=1))
        elif admit is Admit.REFUSE:
            self.refuse(TooManyConnections(limit=self.limits.max_connections, retry_after=1))
        else:
            self.probation = admit is Admit.PROBATION

    def connection_lost(self, exc: Exception | None) -> None:
        """uvicorn's, then the running request's handler hears of it at once
        (`asgi.DisconnectWatch`): no task per request waits on `receive()` for it."""
        super().connection_lost(exc)
        self.sources.closed(self.source)
        self.share.lost(self, self.proven, self.was_cut)
        gone = self._on_gone
        if gone is not None:
            self._on_gone = None
            gone()

    def _set_on_gone(self, callback: Callable[[], None] | None) -> None:
        self._on_gone = callback

    def data_received(self, data: bytes) -> None:
        """uvicorn's, reading no more once refused, and refusing a head that grows past
        MAX_HEADER_BYTES before the parser has a whole header to show.

        Bytes on a connection that was waiting for a request start its head (the phase
        changes here rather than in `on_message_begin`: one call less per request); a
        later request's head time counts from them (a new step)."""
        phase = self.phase
        if phase == CLOSING:
            return  # discarded while lingering
        self.reads += 1  # (no keep-alive timer to cancel: `on_response_complete` arms none)
        if phase != BODY:
            self._head_received += len(data)
            if phase != HEAD:
                if phase != NEW:  # a later request: its own head time
                    self.step += 1
                self.phase = HEAD
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, QuorumError):
                self.refuse(exc.__context__)
            else:
                self._invalid()
            return
        except httptools.HttpParserError:
            self._invalid()
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self.phase == HEAD and self._head_received > self._max_header_bytes:
            self.refuse(HeadersTooLarge(limit=self._max_header_bytes))

    # Parser callbacks

    def on_headers_complete(self) -> None:
        """The head's limits, exactly; past one, raising stops the parser before uvicorn
        starts the request (`data_received` answers). The exact size is summed only when
        the bytes read could hold more."""
        if self._head_received > self._max_header_bytes or len(self.headers) > self._max_headers:
            self._check_head()
        hosts = self.hosts
        if hosts is not None and not hosts.allows(self.headers):
            raise InvalidHost()
        if self.probation:
            self._prove()
        self.phase = BODY
        self.step += 1
        self.scope[GONE_HOOK] = self._gone_hook  # type: ignore[literal-required]
        _headers_complete(self)

    def on_message_complete(self) -> None:
        self.phase = IDLE
        self.step += 1
        self._head_received = 0
        _message_complete(self)

    def on_response_complete(self) -> None:
        """uvicorn's, less its keep-alive timer: a connection answered, with nothing of a
        next request read, is KEPT, and the sweep closes it after KEEP_ALIVE_TIMEOUT_S."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        elif self.phase == IDLE:
            self.phase = KEPT
            self.step += 1

    # Limits

    def _check_head(self) -> None:
        if len(self.headers) > self._max_headers:
            raise HeadersTooLarge(f"more than {self._max_headers} request headers")
        size = len(self.url) + sum(len(name) + len(value) for name, value in self.headers)
        if size > self._max_header_bytes:
            raise HeadersTooLarge(limit=self._max_header_bytes)

    def _prove(self) -> None:
        """The first head of a connection on probation (`ConnectionShare`): served if it
        proves who sent it, else 503 too_many_connections."""
        self.probation = False
        self.proven = self.share.heard(self, {"headers": self.headers, "client": self.client})
        if not self.proven:
            limits = self.limits
            raise TooManyConnections(
                f"{limits.max_connections} connections are open and the last "
                f"{self.share.reserve} are kept for authenticated clients; retry in 1 s",
                limit=limits.max_connections,
                retry_after=1,
            )

    def cut(self) -> None:
        """Close at once, unanswered, to make room (`ConnectionShare`: on probation, and
        no head sent yet)."""
        self.was_cut = True
        self.phase = CLOSING
        self.transport.abort()

    def on_deadline(self, now: float) -> None:
        """The phase stood still past its timeout (`ConnectionWatch`).

        1. Lingering after a refusal: close.
        2. Nothing sent on a new connection, or on one kept alive: close, without an
           answer.
        3. A body the runner is not reading now (buffer full, the client waits for
           `100 Continue`): not the client's delay, wait another BODY_TIMEOUT_S.
        4. A head or body too slow: 408 if no answer has started, else close.
        """
        if self.phase == CLOSING:  # 1
            self.transport.close()
            return
        if self.phase == NEW or self.phase == KEPT:  # 2
            self.transport.close()
            return
        cycle = self.cycle
        if self.phase == BODY and (
            self.flow.read_paused or (cycle is not None and cycle.waiting_for_100_continue)
        ):  # 3
            self.since = now
            return
        if self.phase == HEAD:  # 4
            answering = cycle is not None and not cycle.response_complete
            timeout = self.limits.header_timeout_s
        else:
            answering = cycle is not None and cycle.response_started
            timeout = self.limits.body_timeout_s
        if answering:
            self.transport.close()
        else:
            self.refuse(RequestTimeout(phase=_PHASES[self.phase], timeout=timeout))

    def resume_writing(self) -> None:
        self.resumes += 1
        super().resume_writing()

    def on_write_stall(self) -> None:
        """The client has read nothing for WRITE_STALL_TIMEOUT_S: cut it (abort drops what
        is buffered; a close would wait for the client to read it)."""
        log.info("cut a client that stopped reading for %g s", self.limits.write_stall_timeout_s)
        for count in self.stalls:
            count()
        self.phase = CLOSING
        self.transport.abort()

    def refuse(self, error: QuorumError) -> None:
        """Answer `error` in the envelope with `Connection: close`, read no more (what
        arrives is discarded for at most LINGER_S), then close."""
        if self.phase == CLOSING or self.transport.is_closing():
            return
        log.info("refused a client: %s", error)
        self.phase = CLOSING
        self.step += 1
        if self.cycle is not None:
            self.cycle.keep_alive = False
        body = error_body(error)
        head = [
            STATUS_LINE[error_status(error)],
            b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body),
            b"connection: close\r\n",
        ]
        head += [b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in error_headers(error).items()]
        self.transport.write(b"".join(head) + b"\r\n" + body)
        self.loop.call_soon(self._half_close)  # after the coalesced write has left

    def _half_close(self) -> None:
        transport = self.transport
        if transport.is_closing():
            return
        if transport.can_write_eof():
            transport.write_eof()
        else:
            transport.close()

    def _invalid(self) -> None:
        msg = "Invalid HTTP request received."
        self.logger.warning(msg)
        self.send_400_response(msg)


_PHASES = {HEAD: "request headers", BODY: "request body"}
# The base class's callbacks, called directly: cheaper than super() on every request.
_headers_complete = CoalescingHttpToolsProtocol.on_headers_complete
_message_complete = CoalescingHttpToolsProtocol.on_message_complete


def protocol_with(
    limits: ClientLimits,
    on_write_stall: Callable[[], None] | None = None,
    prove: Prove | None = None,
) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for one server: uvicorn builds one instance per connection;
    `on_write_stall` is called for each client cut for not reading; `prove(scope)` raises
    unless a request proves who sent it (None: nothing can, no connections are reserved)."""
    attrs = {
        "limits": limits,
        "watch": ConnectionWatch(limits),
        "sources": SourceCounts(limits.max_per_source, limits.trusted),
        "share": ConnectionShare(limits.max_connections, limits.reserved, prove),
        "hosts": HostAllowList(limits.hosts) if limits.hosts is not None else None,
        "stalls": [on_write_stall] if on_write_stall is not None else [],
        "__module__": __name__,
    }
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), attrs)
