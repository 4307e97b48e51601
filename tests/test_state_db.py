"""The one way the embedded stores open STATE_DB (faults/state_db.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from faults.state_db import StateDb

pytestmark = pytest.mark.timeout(30)


def test_state_db_is_wal_with_full_sync(tmp_path: Path) -> None:
    """The file is made (with its folder) in WAL mode; the connection fsyncs each commit."""
    state = StateDb(tmp_path / "sub" / "state.sqlite3")
    assert state.call(lambda db: db.execute("PRAGMA synchronous").fetchone()) == (2,)  # FULL
    plain = sqlite3.connect(tmp_path / "sub" / "state.sqlite3")
    assert plain.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    plain.close()
    state.close()


async def test_state_db_call_is_one_transaction(tmp_path: Path) -> None:
    """A call that raises leaves nothing written; one that returns is committed."""
    state = StateDb(tmp_path / "state.sqlite3")
    state.call(lambda db: db.execute("CREATE TABLE t (v INTEGER)"))

    def half(db: sqlite3.Connection) -> None:
        db.execute("INSERT INTO t VALUES (1)")
        raise RuntimeError("after the first write")

    with pytest.raises(RuntimeError):
        await state.run(half)
    await state.run(lambda db: db.execute("INSERT INTO t VALUES (2)"))
    assert state.call(lambda db: db.execute("SELECT v FROM t").fetchall()) == [(2,)]
    state.close()


def test_state_db_closed_refuses_calls(tmp_path: Path) -> None:
    """A closed store's calls raise sqlite3.Error (each store maps it to its 503)."""
    state = StateDb(tmp_path / "state.sqlite3")
    state.close()
    with pytest.raises(sqlite3.Error):
        state.call(lambda db: db.execute("SELECT 1"))


def test_state_db_normal_sync_is_chosen_and_others_refused(tmp_path: Path) -> None:
    """STATE_DB_SYNC=normal gives synchronous=NORMAL; a mode that is not full or normal
    (off: a power cut could corrupt the file) is refused."""
    state = StateDb(tmp_path / "state.sqlite3", "normal")
    assert state.call(lambda db: db.execute("PRAGMA synchronous").fetchone()) == (1,)
    state.close()
    with pytest.raises(ValueError):
        StateDb(tmp_path / "other.sqlite3", "off")
