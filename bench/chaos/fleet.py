"""The soak's processes: the Redis (a Sentinel group, or a three-node Cluster), three
runners, their engines and a fake ComfyUI each (async jobs; `--ledger`: every prompt it
runs), and the three kills (each waits on observable state: the sentinels' or the
cluster's answer, /health, a pid)."""

from __future__ import annotations

import json
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

from bench.chaos.cluster import ChaosCluster
from tests.fixtures.launch import start_fake
from tests.support.engines import comfyui_root
from tests.support.fleet import entry
from tests.support.redis_sentinel import SERVICE, SentinelGroup, wait_until
from tests.support.runner_proc import RunnerProcess, start_runner, wait_started
from tests.support.tokens import DEV_REGISTRY

MAX_TOKENS = 16  # each chat request's output bound (what a budget reserves)
JOB_MODEL = "img"  # each runner's fake ComfyUI: the async jobs' model
WORKFLOW = {  # the job's x_seed is the empty image's colour: each run is told apart
    "name": "chaos",
    "params": {
        "seed": {"type": "int", "default": 0, "min": 0, "max": 0xFFFFFF},
        "filename_prefix": {"type": "str"},
    },
    "graph": {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": "{{seed}}"},
        },
        "2": {
            "class_type": "ImageBlur",
            "inputs": {"image": ["1", 0], "blur_radius": 1, "sigma": 1},
        },
        "3": {
            "class_type": "SaveImage",
            "inputs": {"filename_prefix": "{{filename_prefix}}", "images": ["2", 0]},
        },
    },
}


def runner_id(index: int) -> str:
    """Each runner its own RUNNER_ID (the pod's name, operations.md): a token's `aud`, and
    the owner of the jobs it runs, kept through its restarts."""
    return f"chaos-{index}"


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


def models_file(real: RealLlama | None, comfy_url: str = "", workflow: str = "") -> str:
    text = "models:\n" + entry("m", "llama-server-ok", preload=True, restart=True)
    if comfy_url:
        text += (
            f"  - {{id: {JOB_MODEL}, backend: comfyui, url: '{comfy_url}',"
            f" workflow: '{workflow}'}}\n"
        )
    if real is not None:
        text += (
            "  - id: real\n    backend: llama-server\n"
            f"    path: {real.gguf}\n    bin: {real.bin}\n"
            "    context_length: 512\n    parallel: 1\n    preload: true\n    restart: true\n"
        )
    return text


class ChaosFleet:
    """Start with `with ChaosFleet(...) as fleet`; everything stops at the end."""

    def __init__(
        self,
        tenants: dict[str, int],
        in_flight: int,
        real: RealLlama | None,
        redis: str = "sentinel",
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="quorum-chaos-"))
        (self.dir / "tenants.yaml").write_text(tenants_file(tenants, in_flight))
        (self.dir / "workflow.json").write_text(json.dumps(WORKFLOW))
        self.real = real
        self.redis = redis
        self.group = SentinelGroup()
        self.cluster = ChaosCluster(self.dir / "cluster")
        self.comfy: list[str] = []  # each runner's fake ComfyUI
        self.slots: list[Slot] = []
        self._stack = ExitStack()

    def ledgers(self) -> list[Path]:
        """Every prompt each fake ComfyUI ran (one JSON line each)."""
        return [self.dir / f"comfy-{i}.ledger" for i in range(3)]

    def __enter__(self) -> ChaosFleet:
        self._stack.callback(shutil.rmtree, self.dir, True)
        if self.redis == "cluster":
            self._stack.callback(self.cluster.stop)
            self.cluster.start()
        else:
            self._stack.callback(self.group.stop)
            self.group.start()
        for i, ledger in enumerate(self.ledgers()):
            root = comfyui_root(self.dir / f"ComfyUI-{i}")
            fake = start_fake(
                "fake_comfyui", "--base-directory", str(root), "--ledger", str(ledger)
            )
            self.comfy.append(self._stack.enter_context(fake).url)
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
        if self.redis == "cluster":
            redis = {
                "REDIS_MODE": "cluster",
                "REDIS_URL": self.cluster.url,
                "REDIS_CLUSTER_NODES": self.cluster.nodes,
            }
        else:
            redis = {
                "REDIS_MODE": "sentinel",
                "REDIS_SENTINELS": self.group.sentinels,
                "REDIS_SENTINEL_SERVICE": SERVICE,
            }
        return {
            **redis,
            "GOVERNANCE_REGISTRY": str(DEV_REGISTRY),
            "RUNNER_ID": runner_id(index),
            "TENANTS_FILE": str(self.dir / "tenants.yaml"),
            "NONCE_REPLICAS_TIMEOUT_MS": "500",
            "ENGINE_RESTART_BACKOFF_S": "0.5",
            "LIFECYCLE_RATE_LIMIT": "1000/minute",  # one source sends every flush
            # the stand-in engines' `python3` is this one (the runner passes PATH on)
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        }

    def _start_runner(self, index: int, wait: bool = True) -> RunnerProcess:
        real = self.real if index == 0 else None  # one real llama-server, on runner 0
        models = models_file(real, self.comfy[index], str(self.dir / "workflow.json"))
        cm = start_runner(models_file=models, env=self._env(index), wait_ready=False)
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
        again as its replica (attached). Returns the kill's time. On a cluster: SIGKILL
        one node and start it again on its own files (ChaosCluster)."""
        if self.redis == "cluster":
            return self.cluster.kill_and_restart_one()
        old = self.group.primary()
        killed = time.monotonic()
        self.group.kill(old)
        wait_until(lambda: self.group.primary() != old, "sentinels promoted the replica", 90)
        self.group.restart_as_replica(old)
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
