"""CoalescingTransport (runner/http/coalesce.py): one write per event-loop step; and
CheckedOnceCycle, uvicorn's response head checked in two searches."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

import pytest
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from runner.http.coalesce import CheckedOnceCycle, CoalescingTransport


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> Any:
        return f"info:{name}"


async def test_coalesce_joins_writes_of_one_step() -> None:
    """Headers and body written in the same step leave in one write, in order."""
    inner = RecordingTransport()
    t = CoalescingTransport(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"HTTP/1.1 200 OK\r\n\r\n")
    t.write(b"body")
    assert inner.writes == []
    await asyncio.sleep(0)
    assert inner.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]


async def test_coalesce_writes_of_later_steps_are_separate() -> None:
    """A write in a later step is not held back for, or merged with, an earlier one."""
    inner = RecordingTransport()
    t = CoalescingTransport(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"a")
    await asyncio.sleep(0)
    t.write(b"b")
    await asyncio.sleep(0)
    assert inner.writes == [b"a", b"b"]


async def test_coalesce_close_sends_pending_first() -> None:
    """close() sends what is pending before closing; nothing is written after."""
    inner = RecordingTransport()
    t = CoalescingTransport(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"last")
    t.close()
    assert inner.writes == [b"last"] and inner.closed
    await asyncio.sleep(0)
    assert inner.writes == [b"last"]


async def test_coalesce_drops_writes_to_a_closing_transport() -> None:
    """Pending bytes for a connection the peer already closed are dropped, not raised."""
    inner = RecordingTransport()
    t = CoalescingTransport(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"late")
    inner.closed = True
    await asyncio.sleep(0)
    assert inner.writes == []


async def test_coalesce_delegates_everything_else() -> None:
    """Other transport methods reach the real transport."""
    loop = asyncio.get_running_loop()
    t = CoalescingTransport(RecordingTransport(), loop)  # type: ignore[arg-type]
    assert t.get_extra_info("peername") == "info:peername"


def _cycle(
    cls: type[RequestResponseCycle], method: str = "POST", keep_alive: bool = True
) -> RequestResponseCycle:
    scope: Any = {"method": method, "http_version": "1.1", "path": "/", "query_string": b""}
    logger = logging.getLogger("test")
    return cls(
        scope=scope,
        transport=RecordingTransport(),  # type: ignore[arg-type]
        flow=FlowControl(RecordingTransport()),  # type: ignore[arg-type]
        logger=logger,
        access_logger=logger,
        access_log=False,
        default_headers=[(b"date", b"Thu, 26 Nov 2026 10:00:00 GMT")],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=keep_alive,
        on_response=lambda: None,
    )


HEADS: list[tuple[str, int, list[tuple[bytes, bytes]]]] = [
    ("POST", 200, [(b"Content-Type", b"application/json"), (b"content-length", b"2")]),
    ("POST", 200, [(b"content-type", b"text/event-stream")]),
    ("POST", 200, [(b"transfer-encoding", b"Chunked"), (b"x-a", b"b")]),
    ("POST", 503, [(b"content-length", b"0"), (b"Connection", b"keep-alive, Close")]),
    ("HEAD", 200, [(b"x-request-id", b"r-1")]),
    ("POST", 204, []),
    ("POST", 304, [(b"etag", b'"x"')]),
    (
        "POST",
        200,
        [(b"x-a", b"1"), (b"content-type", b"application/json"), (b"content-length", b"2")],
    ),
    ("POST", 200, [(b"content-length", b"2"), (b"x-a", b"1")]),
    ("POST", 200, [(b"x-a", b"1"), (b"X-B", b"2")]),
    ("POST", 200, [(b"x-conn", b"1"), (b"ection", b"2")]),
    ("HEAD", 200, [(b"x-a", b"1"), (b"content-length", b"7")]),
    ("POST", 204, [(b"x-a", b"1")]),
]


@pytest.mark.parametrize("keep_alive", [True, False])
@pytest.mark.parametrize(("method", "status", "headers"), HEADS)
async def test_checked_once_cycle_writes_uvicorns_head(
    method: str, status: int, headers: list[tuple[bytes, bytes]], keep_alive: bool
) -> None:
    """CheckedOnceCycle writes the same head, and keeps the same connection and length
    state, as uvicorn's own cycle (the runner's own heads in one pass included)."""
    states = []
    for cls in (RequestResponseCycle, CheckedOnceCycle):
        cycle = _cycle(cls, method, keep_alive)
        await cycle.send({"type": "http.response.start", "status": status, "headers": headers})
        transport: Any = cycle.transport
        states.append(
            (
                transport.writes,
                cycle.keep_alive,
                cycle.chunked_encoding,
                cycle.expected_content_length,
                cycle.response_started,
            )
        )
    assert states[0] == states[1]


@pytest.mark.parametrize(
    ("headers", "error"),
    [
        ([(b"x-ok", b"1"), (b"bad name", b"1")], "Invalid HTTP header name."),
        ([(b"x-ok", b"1"), (b"x(y)", b"1")], "Invalid HTTP header name."),
        ([(b"x-ok", b"1"), (b"x-split", b"a\r\nx-injected: 1")], "Invalid HTTP header value."),
        ([(b"x-nul", b"a\x00b")], "Invalid HTTP header value."),
    ],
)
async def test_checked_once_cycle_refuses_what_uvicorn_refuses(
    headers: list[tuple[bytes, bytes]], error: str
) -> None:
    """A head with a forbidden character in any name or value is refused with uvicorn's
    error, and nothing is written."""
    for cls in (RequestResponseCycle, CheckedOnceCycle):
        cycle = _cycle(cls)
        with pytest.raises(RuntimeError, match=re.escape(error)):
            await cycle.send({"type": "http.response.start", "status": 200, "headers": headers})
        transport: Any = cycle.transport
        assert transport.writes == []
