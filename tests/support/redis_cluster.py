"""A real three-primary Redis Cluster on free loopback ports (redis-server with
`--cluster-enabled yes`, joined and given every slot by `redis-cli --cluster create`),
owned by the test session that started it; `flush()` empties it between tests."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from faults.redis_clients import cluster_url
from tests.support.ports import free_port
from tests.support.redis_sentinel import ask, wait_until


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed: run scripts/install-system")
    return found


def _node_port() -> int:
    """A free port whose cluster bus port (+10000, opened by the node too) is free."""
    while True:
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


class RedisClusterGroup:
    """Three primaries, no replicas, slots split evenly by redis-cli."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="quorum-cluster-"))
        self.ports = [_node_port() for _ in range(3)]
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        """What REDIS_URL becomes with REDIS_MODE=cluster and REDIS_URL naming one node."""
        return cluster_url(f"redis://127.0.0.1:{self.ports[0]}")

    def start(self) -> RedisClusterGroup:
        for port in self.ports:
            folder = self.dir / str(port)
            folder.mkdir()
            args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly"]
            args += ["no", "--dir", str(folder), "--cluster-enabled", "yes"]
            args += ["--cluster-config-file", str(folder / "nodes.conf")]
            self.procs.append(
                subprocess.Popen(
                    [_binary("redis-server"), *args],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        for port in self.ports:
            wait_until(lambda p=port: ask(p, "PING").startswith(b"+PONG"), f"node {port} up")
        nodes = [f"127.0.0.1:{port}" for port in self.ports]
        subprocess.run(
            [_binary("redis-cli"), "--cluster", "create", *nodes, "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        for port in self.ports:
            wait_until(
                lambda p=port: b"cluster_state:ok" in ask(p, "CLUSTER", "INFO"),
                f"node {port} sees every slot served",
            )
        return self

    def flush(self) -> None:
        """Empty every primary (between tests)."""
        for port in self.ports:
            ask(port, "FLUSHALL")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def running_cluster() -> Iterator[RedisClusterGroup]:
    group = RedisClusterGroup()
    try:
        yield group.start()
    finally:
        group.stop()


def redis_url(request: pytest.FixtureRequest) -> str:
    """For a store fixture parametrized "redis" / "cluster": a fresh redis-server's URL, or
    the session's cluster (emptied) as REDIS_MODE=cluster makes it."""
    name = "redis_cluster" if request.param == "cluster" else "redis_server"
    return str(request.getfixturevalue(name).url)
