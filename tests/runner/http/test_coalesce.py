"""CoalescingTransport (runner/http/coalesce.py): one write per event-loop step."""

from __future__ import annotations

import asyncio
from typing import Any

from runner.http.coalesce import CoalescingTransport


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
