"""The soak's processes: the Sentinel group, three runners and their engines, and the
three kills (each waits on observable state: the sentinels' answer, /health, a pid)."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx

from tests.support.fleet import entry
from tests.support.redis_sentinel import SERVICE, SentinelGroup, ask, wait_until
from tests.support.runner_proc import RunnerProcess, start_runner, wait_started
from tests.support.tokens import DEV_REGISTRY

FLEET_ID = "chaos-fleet"  # one RUNNER_ID: a token (aud) is good on every runner
MAX_TOKENS = 16  # each chat request's output bound (what a budget reserves)


@dataclass(frozen=True)
class RealLlama:
    """The real llama-server and the GGUF of the default chat model."""

    bin: str
    gguf: Path


@dataclass
class Slot:
    """One runner of the fleet; `generation` counts its restarts."""

    index: int
    runner: RunnerProcess
    generation: int = 0
    killed_at: dict[int, float] = field(default_factory=dict)  # generation -> kill time

    @property
    def url(self) -> str:
        return self.runner.url


def tenants_file(tenants: dict[str, int], in_flight: int) -> str:
    """Each tenant an output-token budget for the day (no window slides during a soak)."""
    lines = ["tenants:"]
    for name, tokens in tenants.items():
        lines += [
            f"  {name}:",
            f"    max_in_flight: {in_flight}",
            f"    token_budgets: [{{tokens: {tokens}, per: day, count: output}}]",
        ]
    return "\n".join(lines) + "\n"


def models_file(real: RealLlama | None) -> str:
    text = "models:\n" + entry("m", "llama-server-ok", preload=True, restart=True)
    if real is not None:
        text += (
            "  - id: real\n    backend: llama-server\n"
            f"    path: {real.gguf}\n    bin: {real.bin}\n"
            "    context_length: 512\n    parallel: 1\n    preload: true\n    restart: true\n"
        )
    return text


class ChaosFleet:
    """Start with `with ChaosFleet(...) as fleet`; everything stops at the end."""

    def __init__(self, tenants: dict[str, int], in_flight: int, real: RealLlama | None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="quorum-chaos-"))
        (self.dir / "tenants.yaml").write_text(tenants_file(tenants, in_flight))
        self.real = real
        self.group = SentinelGroup()
        self.slots: list[Slot] = []
        self._stack = ExitStack()

    def __enter__(self) -> ChaosFleet:
        self._stack.callback(shutil.rmtree, self.dir, True)
        self._stack.callback(self.group.stop)
        self.group.start()
        runners = [self._start_runner(i, wait=False) for i in range(3)]
        for runner in runners:
            wait_started(runner, timeout=120)
        self.slots = [Slot(i, r) for i, r in enumerate(runners)]
        for slot in self.slots:
            try:
                wait_until(partial(self.healthy, slot), f"runner {slot.index} healthy", 120)
            except RuntimeError as exc:
                raise RuntimeError(f"{exc}; its log:\n{slot.runner.log()[-3000:]}") from None
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _env(self, index: int) -> dict[str, str]:
        return {
            "REDIS_MODE": "sentinel",
            "REDIS_SENTINELS": self.group.sentinels,
            "REDIS_SENTINEL_SERVICE": SERVICE,
            "GOVERNANCE_REGISTRY": str(DEV_REGISTRY),
            "RUNNER_ID": FLEET_ID,
            "TENANTS_FILE": str(self.dir / "tenants.yaml"),
            "NONCE_REPLICAS_TIMEOUT_MS": "500",
            "ENGINE_RESTART_BACKOFF_S": "0.5",
            "LIFECYCLE_RATE_LIMIT": "1000/minute",  # one source sends every flush
            # the stand-in engines' `python3` is this one (the runner passes PATH on)
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        }

    def _start_runner(self, index: int, wait: bool = True) -> RunnerProcess:
        real = self.real if index == 0 else None  # one real llama-server, on runner 0
        cm = start_runner(models_file=models_file(real), env=self._env(index), wait_ready=False)
        runner = self._stack.enter_context(cm)
        if wait:
            wait_started(runner, timeout=120)
        return runner

    def healthy(self, slot: Slot) -> bool:
        try:
            return httpx.get(slot.url + "/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    # -- the kills ------------------------------------------------------------------

    def kill_redis_primary(self) -> float:
        """SIGKILL the primary; once the sentinels named the replica, start the old one
        again as its replica (attached). Returns the kill's time."""
        old = self.group.primary()
        killed = time.monotonic()
        self.group.kill(old)
        wait_until(lambda: self.group.primary() != old, "sentinels promoted the replica", 90)
        new = self.group.primary()
        folder = self.dir / f"redis-{old}-{time.monotonic_ns()}"
        folder.mkdir()
        self.group._spawn(
            old,
            "--port",
            str(old),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(folder),
            "--replicaof",
            "127.0.0.1",
            str(new),
        )
        wait_until(
            lambda: b"master_link_status:up" in ask(old, "INFO", "replication"),
            "the old primary back as a replica",
            90,
        )
        return killed

    def kill_runner(self, slot: Slot) -> float:
        """SIGKILL the runner and start it again (a new port); returns the kill's time."""
        engines = _descendants(slot.runner.proc.pid)
        killed = time.monotonic()
        slot.killed_at[slot.generation] = killed
        slot.runner.proc.send_signal(signal.SIGKILL)
        slot.runner.proc.wait(10)
        for pid in engines:  # its engines go with it, as its container's would
            _kill(pid)
        slot.runner = self._start_runner(slot.index)
        slot.generation += 1
        return killed

    def kill_engine(self, slot: Slot) -> float:
        """SIGKILL the stand-in engine of model `m` under the runner (it restarts it)."""
        pids = [p for p in _descendants(slot.runner.proc.pid) if "fake_llama_cli" in _cmd(p)]
        if not pids:
            raise RuntimeError(f"runner {slot.index}: no engine process found")
        killed = time.monotonic()
        for pid in pids:
            _kill(pid)
        return killed


def _children() -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        found.setdefault(ppid, []).append(int(name))
    return found


def _descendants(pid: int) -> list[int]:
    tree, out, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _kill(pid: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
