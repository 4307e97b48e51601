"""PendingWrites: writes a down store refused are written once it is back, the latest per
record, never after a later write (`runner/floor/pending_writes.py`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from runner.floor.pending_writes import PendingWrites

pytestmark = pytest.mark.timeout(10)


class Down(Exception):
    pass


class FlakyStore:
    """A store of (key, value) records that raises `Down` while `down` is set."""

    def __init__(self) -> None:
        self.down = False
        self.records: dict[str, int] = {}
        self.writes: list[tuple[str, int]] = []
        self.changed = asyncio.Event()

    async def put(self, record: tuple[str, int]) -> int:
        if self.down:
            raise Down("store down")
        self.records[record[0]] = record[1]
        self.writes.append(record)
        self.changed.set()
        return record[1]


async def _until(check: Callable[[], bool], store: FlakyStore) -> None:
    """Wait until `check` holds, woken by each write the store takes."""
    while not check():
        store.changed.clear()
        await asyncio.wait_for(store.changed.wait(), 5)


async def test_pending_writes_refused_write_lands_when_store_is_back() -> None:
    """With the store down, `write` answers None and keeps the record; once the store is
    back the latest record of each key is written, each once."""
    store = FlakyStore()
    writes: PendingWrites[tuple[str, int], int] = PendingWrites(
        store.put, Down, "record", retry_s=0.01
    )
    store.down = True
    assert await writes.write("a", ("a", 1)) is None
    assert await writes.write("a", ("a", 2)) is None
    assert await writes.write("b", ("b", 1)) is None
    assert len(writes) == 2 and store.records == {}
    store.down = False
    await _until(lambda: len(writes) == 0 and len(store.records) == 2, store)
    assert store.records == {"a": 2, "b": 1}
    assert sorted(store.writes) == [("a", 2), ("b", 1)]
    await writes.aclose()


async def test_pending_writes_later_write_supersedes_pending_one() -> None:
    """A write that gets through drops the pending record of its key: the retry never
    writes the older record over it."""
    store = FlakyStore()
    writes: PendingWrites[tuple[str, int], int] = PendingWrites(
        store.put, Down, "record", retry_s=0.05
    )
    store.down = True
    await writes.write("a", ("a", 1))
    store.down = False
    assert await writes.write("a", ("a", 2)) == 2
    assert len(writes) == 0
    await writes.write("b", ("b", 1))  # a later round would have written ("a", 1) first
    await writes.aclose()
    assert store.writes == [("a", 2), ("b", 1)]


async def test_pending_writes_aclose_drops_what_is_pending() -> None:
    """Closing while the store is still down ends the retries at once; the record the
    store never took stays unwritten (a restarted runner marks it interrupted)."""
    store = FlakyStore()
    writes: PendingWrites[tuple[str, int], int] = PendingWrites(
        store.put, Down, "record", retry_s=0.01
    )
    store.down = True
    await writes.write("a", ("a", 1))
    await writes.aclose()
    assert len(writes) == 1 and store.writes == []
