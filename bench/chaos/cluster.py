"""The soak's Redis Cluster (`--redis cluster`): three primaries as tests/support starts
them, each with an append-only file fsynced on every write, so a node SIGKILLed and started
again on its own files comes back with what it acknowledged (a cluster without replicas
has no failover: while a node is down, the keys of its slots cannot be read or written)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from tests.support.redis_cluster import _binary, _node_port
from tests.support.redis_sentinel import ask, wait_until


class ChaosCluster:
    def __init__(self, folder: Path) -> None:
        self.dir = folder
        self.ports: list[int] = []
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self._next = 0  # the node the next kill takes, in turn

    @property
    def url(self) -> str:
        """REDIS_URL with REDIS_MODE=cluster: one node (the runner makes it the cluster's)."""
        return f"redis://127.0.0.1:{self.ports[0]}"

    @property
    def nodes(self) -> str:
        """REDIS_CLUSTER_NODES: the other nodes to start from."""
        return ",".join(f"127.0.0.1:{p}" for p in self.ports[1:])

    def _spawn(self, port: int) -> None:
        folder = self.dir / str(port)
        folder.mkdir(parents=True, exist_ok=True)
        args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(folder)]
        args += ["--appendonly", "yes", "--appendfsync", "always", "--cluster-enabled", "yes"]
        args += ["--cluster-config-file", str(folder / "nodes.conf")]
        self.procs[port] = subprocess.Popen(
            [_binary("redis-server"), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_until(lambda: ask(port, "PING").startswith(b"+PONG"), f"node {port} up")

    def _addresses(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.ports]

    def _all_ok(self) -> bool:
        return all(b"cluster_state:ok" in ask(p, "CLUSTER", "INFO") for p in self.ports)

    def start(self) -> None:
        self.ports = [_node_port() for _ in range(3)]
        for port in self.ports:
            self._spawn(port)
        subprocess.run(
            [_binary("redis-cli"), "--cluster", "create", *self._addresses(), "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        wait_until(self._all_ok, "every node sees every slot served", 60)

    def kill_and_restart_one(self) -> float:
        """SIGKILL the next node in turn, start it again on its files; returns the kill's
        time once the cluster serves every slot again."""
        port = self.ports[self._next % len(self.ports)]
        self._next += 1
        killed = time.monotonic()
        self.procs[port].kill()
        self.procs[port].wait(10)
        self._spawn(port)
        wait_until(self._all_ok, "the cluster whole again", 90)
        return killed

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)
