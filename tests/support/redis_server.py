"""A real redis-server on a free loopback port, owned by the test that started it.

Tests start their own server so they can also stop or break it on purpose; the
benchmarks use the same helper.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.ports import free_port


class RedisServer:
    """One redis-server process; `url` is what REDIS_URL would hold."""

    def __init__(self, port: int | None = None, *, appendonly: bool = False) -> None:
        self.port = port or free_port()
        self.appendonly = appendonly  # persist to an append-only file, as deployments do
        self._dir = tempfile.mkdtemp(prefix="quorum-redis-")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        os.makedirs(self._dir, exist_ok=True)  # stop() removed it; a restart recreates it
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: run scripts/install-system")
        self._proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes" if self.appendonly else "no",
                "--dir",
                self._dir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self, *, keep_data: bool = False) -> None:
        """Stop the server; `keep_data` keeps its folder (the append-only file), so the
        next `start()` finds what it held, as a restarted production Redis does."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if not keep_data:
            shutil.rmtree(self._dir, ignore_errors=True)


@contextmanager
def running_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()
