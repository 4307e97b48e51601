"""A real Redis primary, one replica and three sentinels on free loopback ports (the
redis-server binary, `--sentinel` for the sentinels), owned by the test that started them,
so it can SIGKILL the primary and watch the sentinels promote the replica."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from faults.redis_clients import sentinel_url
from tests.support.ports import free_port

SERVICE = "quorum"
DOWN_AFTER_MS = 3000
"""How long a server may not answer before a sentinel calls it down. A sentinel pings every
second at most, so at 1000 ms the primary it has just promoted could be called down before
its first answer came back: seen in the chaos soak (2 of 6 runs here), where the sentinels
then failed over again, to the old primary restarted empty and not yet synced, and the
fleet's Redis state was lost."""


def _binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed: run scripts/install-system")
    return binary


def ask(port: int, *words: str, timeout: float = 1.0) -> bytes:
    """One command in RESP to a local server; its raw answer (enough to poll on)."""
    command = f"*{len(words)}\r\n" + "".join(f"${len(w)}\r\n{w}\r\n" for w in words)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(command.encode())
        answer = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            chunk = conn.recv(65536)
            answer += chunk
            if not chunk or answer.endswith(b"\r\n"):
                break
        return answer


def wait_until(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll `check()` until it is true; OSError counts as false."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout} s")
        time.sleep(0.05)


class SentinelGroup:
    """Primary, replica and three sentinels watching the primary as `quorum`."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="quorum-sentinel-"))
        self.primary_port = free_port()
        self.replica_port = free_port()
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        """What the runner's REDIS_URL becomes with REDIS_MODE=sentinel."""
        return sentinel_url(self.sentinels, SERVICE)

    @property
    def sentinels(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)

    def _spawn(self, port: int, *args: str) -> None:
        """Start one process; its log goes to `<port>.log` (appended to on a restart)."""
        with (self.dir / f"{port}.log").open("ab") as log:
            self.procs[port] = subprocess.Popen(
                [_binary(), *args], stdout=log, stderr=subprocess.STDOUT
            )

    def _server(self, port: int, *extra: str) -> None:
        folder = self.dir / f"{port}-{time.monotonic_ns()}"  # a restart starts empty
        folder.mkdir()
        self._spawn(port, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "no", "--dir", str(folder), *extra)  # fmt: skip

    def start(self) -> SentinelGroup:
        self._server(self.primary_port)
        self._server(self.replica_port, "--replicaof", "127.0.0.1", str(self.primary_port))
        wait_until(  # attached and synced (not still waiting for the first copy)
            lambda: b"state=online" in ask(self.primary_port, "INFO", "replication"),
            "replica attached",
        )
        for port in self.sentinel_ports:
            conf = self.dir / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary_port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} 5000\n"
            )
            self._spawn(port, str(conf), "--sentinel")
        for port in self.sentinel_ports:
            wait_until(partial(self._sees_all, port), f"sentinel {port} sees the others")
        return self

    def _sees_all(self, port: int) -> bool:
        """The sentinel knows the two other sentinels and the replica."""
        answer = ask(port, "SENTINEL", "MASTER", SERVICE)
        others = b"num-other-sentinels\r\n$1\r\n2\r\n" in answer
        return others and b"num-slaves\r\n$1\r\n1\r\n" in answer

    def primary(self) -> int:
        """The port the first sentinel names as the primary now."""
        answer = ask(self.sentinel_ports[0], "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        return int(answer.split(b"\r\n")[-2])

    def kill(self, port: int) -> None:
        self.procs[port].send_signal(signal.SIGKILL)
        self.procs[port].wait(10)

    def restart_as_replica(self, port: int, timeout: float = 90.0) -> None:
        """Start the server on `port` again, empty, as a replica of the primary the
        sentinels name, and wait until the group is whole again: the sentinels' primary,
        whichever it is by then, has a replica online (should the sentinels fail over
        once more, the group is whole all the same; DOWN_AFTER_MS says why they did)."""
        self._server(port, "--replicaof", "127.0.0.1", str(self.primary()))
        try:
            wait_until(self._whole, "the old primary back as a replica", timeout)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{self.report()}") from None

    def _whole(self) -> bool:
        answer = ask(self.primary(), "INFO", "replication")
        return b"role:master" in answer and b",state=online," in answer

    def report(self, lines: int = 20) -> str:
        """What the sentinels name, each server's replication section and the end of each
        process's log: enough to tell, after a failure, how the group stood."""
        parts = [f"sentinels name the primary: {self._named()}"]
        for port in (self.primary_port, self.replica_port):
            try:
                info = ask(port, "INFO", "replication").decode(errors="replace")
            except OSError as exc:
                info = f"unreachable: {exc}"
            parts.append(f"--- {port} INFO replication\n{info.strip()}")
        for log in sorted(self.dir.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    def _named(self) -> str:
        try:
            return str(self.primary())
        except (OSError, ValueError, IndexError) as exc:
            return f"unknown ({exc!r})"

    def cut_off_replica(self) -> None:
        """Freeze the replica (SIGSTOP) and wait until the primary drops it (its
        `repl-timeout`, lowered to 2 s here, runs out): from then on the primary's writes
        reach no replica, while the primary goes on answering."""
        ask(self.primary_port, "CONFIG", "SET", "repl-timeout", "2")
        self.procs[self.replica_port].send_signal(signal.SIGSTOP)
        wait_until(
            lambda: b"connected_slaves:0" in ask(self.primary_port, "INFO", "replication"),
            "the primary dropped the frozen replica",
            timeout=60,
        )

    def fail_over_to_the_cut_off_replica(self) -> None:
        """SIGKILL the primary, thaw the replica (it never gets what the primary took
        meanwhile: the primary is gone), and wait until the sentinels name it primary."""
        self.kill(self.primary_port)
        self.procs[self.replica_port].send_signal(signal.SIGCONT)
        wait_until(lambda: self.primary() == self.replica_port, "failover", timeout=90)
        wait_until(
            lambda: b"role:master" in ask(self.replica_port, "INFO", "replication"),
            "the replica promoted",
        )

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a frozen replica: let it run to its end
                proc.kill()
                proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def running_replica(primary_port: int) -> Iterator[int]:
    """A redis-server replicating the one on `primary_port`, attached (its port)."""
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="quorum-replica-"))
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    args += ["--dir", str(folder), "--replicaof", "127.0.0.1", str(primary_port)]
    proc = subprocess.Popen(
        [_binary(), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_until(
            lambda: b"master_link_status:up" in ask(port, "INFO", "replication"), "replica up"
        )
        # the primary counts a replica in WAIT once it has its first acknowledgement
        # (`state=online`), up to a second after the replica itself says the link is up
        online = b"port=%d,state=online" % port
        wait_until(lambda: online in ask(primary_port, "INFO", "replication"), "replica online")
        yield port
    finally:
        proc.kill()
        proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def running_sentinels() -> Iterator[SentinelGroup]:
    group = SentinelGroup()
    try:
        yield group.start()
    finally:
        group.stop()
