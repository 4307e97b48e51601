"""The sweep that times the runner's connections (runner/http/limits.py): no clock is read
and no timer armed per request; one timer per server, while any connection is open, looks
at every connection four times per shortest timeout and acts on those that stood still.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

LINGER_S = 2.0
"""After a refusal, how long what the client still sends is read and discarded."""

# A connection's phase: what it is waiting for from the client. IDLE: the request is read
# (its answer may still be on its way); KEPT: answered, kept alive for the next request.
NEW, HEAD, BODY, IDLE, CLOSING, KEPT = range(6)


class WatchedLimits(Protocol):
    """The timeouts the watch enforces (`limits.ClientLimits`)."""

    @property
    def header_timeout_s(self) -> float: ...
    @property
    def body_timeout_s(self) -> float: ...
    @property
    def keep_alive_s(self) -> float: ...
    @property
    def write_stall_timeout_s(self) -> float: ...
    @property
    def sweep_s(self) -> float: ...


class Watched:
    """What the watch reads and calls on a connection (`limits.GuardedHttpToolsProtocol`
    sets and implements it); other protocols in the server's set are passed over."""

    flow: Any  # uvicorn's FlowControl (`write_paused`)
    phase: int
    step: int  # +1 at each change of phase
    reads: int  # data_received calls
    mark: tuple[int, int]  # (step, reads) as the watch last saw them
    since: float  # loop time the watch first saw `mark`
    resumes: int  # resume_writing calls
    stall_mark: int  # `resumes` when the watch first saw writes paused
    stalled_since: float

    def on_deadline(self, now: float) -> None:
        raise NotImplementedError

    def on_write_stall(self) -> None:
        raise NotImplementedError


class ConnectionWatch:
    """Checks, while any connection is open, which ones stood still too long.

    A connection's mark is its `step` (it changes with the phase), and in the body phase
    also its `reads`: the head's time runs from the phase's start, the body's from the
    last bytes read. A mark unchanged for the phase's timeout calls `on_deadline`. In any
    phase, writes paused with no resume for WRITE_STALL_TIMEOUT_S call `on_write_stall`.
    """

    def __init__(self, limits: WatchedLimits) -> None:
        self.limits = limits
        self.timeouts = {
            NEW: limits.header_timeout_s,
            HEAD: limits.header_timeout_s,
            BODY: limits.body_timeout_s,
            CLOSING: LINGER_S,
            KEPT: limits.keep_alive_s,
        }
        self._timer: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
        if self._timer is None:
            self._timer = loop.call_later(self.limits.sweep_s, self._sweep, loop, connections)

    def _sweep(self, loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
        self._timer = None
        now = loop.time()
        stall_s = self.limits.write_stall_timeout_s
        for conn in list(connections):
            if not isinstance(conn, Watched):
                continue
            flow = conn.flow
            if flow is not None and flow.write_paused:
                if conn.stall_mark != conn.resumes:
                    conn.stall_mark, conn.stalled_since = conn.resumes, now
                elif now - conn.stalled_since >= stall_s:
                    conn.on_write_stall()
                    continue
            if conn.phase == IDLE:
                continue
            mark = (conn.step, conn.reads if conn.phase == BODY else 0)
            if mark != conn.mark:
                conn.mark, conn.since = mark, now
            elif now - conn.since >= self.timeouts[conn.phase]:
                conn.on_deadline(now)
        if connections:
            self.start(loop, connections)
