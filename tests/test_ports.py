"""The ports tests hand to the servers they start: each pytest-xdist worker has its own
slice below the kernel's ephemeral range, so no two workers and no bind(0) share one."""

from __future__ import annotations

import socket

import pytest

from tests.support.ports import FLOOR, free_port, worker_slice

pytestmark = pytest.mark.timeout(30)


def test_workers_have_disjoint_slices_below_the_ephemeral_range() -> None:
    """Two workers' slices do not overlap, and both end below the ephemeral range."""
    a, b = worker_slice("gw0", 2, 32768), worker_slice("gw1", 2, 32768)
    assert not set(a) & set(b)
    assert a.start == FLOOR and b.stop <= 32768
    assert len(a) == len(b) == (32768 - FLOOR) // 2


def test_a_single_process_has_the_whole_range() -> None:
    """Outside xdist (a benchmark, a plain pytest run) the one process walks all of it."""
    assert worker_slice("master", 1, 32768) == range(FLOOR, 32768)


def test_free_port_skips_a_port_someone_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A port bound by another socket is never handed out, and none is handed out twice in a row."""
    first = free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", first))
        held.listen()
        seen = {free_port() for _ in range(50)}
    assert first not in seen and len(seen) == 50
