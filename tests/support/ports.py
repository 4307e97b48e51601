"""Ports for the servers a test starts: below the kernel's ephemeral range, one slice per
pytest-xdist worker, each candidate checked free by binding it.

`bind(("127.0.0.1", 0))` hands out a port from the ephemeral range, where every process on
the machine takes ports too: the engines a runner starts (`adapters.supervisor.free_port`),
the fakes that bind port 0, every outgoing connection. A port chosen that way and bound a
moment later by the server a test starts can be taken in between: CI once saw the stand-in
Hub fail with EADDRINUSE while a server of the other worker answered on its port, so the
test talked to the wrong server. Here a worker walks its own slice (worker `gwN` of
`PYTEST_XDIST_WORKER_COUNT`, inherited by the runners it starts) from a random point, so
two workers never hand out the same port and no bind(0) anywhere can land on one.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

FLOOR = 20000  # above the ports services listen on by default (Redis 6379, 8000s, ...)
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_next: int | None = None


def _ephemeral_low() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def worker_slice(worker: str, count: int, ephemeral_low: int) -> range:
    """The ports worker `gwN` of `count` hands out: its share of [FLOOR, ephemeral_low)."""
    index = int(worker.removeprefix("gw") or 0) if worker.startswith("gw") else 0
    count = max(count, index + 1)
    size = max((ephemeral_low - FLOOR) // count, 1)
    start = FLOOR + index * size
    return range(start, start + size)


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port nothing is bound to now, from this worker's slice (the server binds it next)."""
    global _next
    ports = worker_slice(
        os.environ.get("PYTEST_XDIST_WORKER", "gw0"),
        int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1),
        _ephemeral_low(),
    )
    if _next is None or _next not in ports:
        _next = random.choice(ports)
    for _ in range(len(ports)):
        port, _next = _next, ports.start + (_next + 1 - ports.start) % len(ports)
        if _is_free(port):
            return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1}")
