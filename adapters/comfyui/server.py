"""One ComfyUI server, started by the runner or attached by URL (its models share it).

- spawned: `python <COMFYUI_PATH>/main.py --listen 127.0.0.1 --port <free port>
  --disable-auto-launch [--cpu]` under the supervisor (`EngineProcess`: own process group,
  log ring, dies with the runner). ComfyUI opens its port only after loading its nodes, so
  it is ready when `GET /system_stats` answers 200. Its folders (models, output) are those
  of `COMFYUI_PATH` (`folder_paths.py` takes them from main.py's own location).
- attached: an already running ComfyUI at a URL; ready when `/system_stats` answers.
  Give its `COMFYUI_PATH` too when checkpoints should be fetched into its folder.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from adapters.comfyui.client import ComfyUIClient, QueueState, SystemStats
from adapters.supervisor import EngineProcess, free_port

log = logging.getLogger("quorum.comfyui")

MB = 1024 * 1024


def command_line(
    python: str, comfyui_path: str, port: int, cpu: bool = False, extra: Sequence[str] = ()
) -> list[str]:
    """The exact argv that starts ComfyUI (pure)."""
    argv = [
        python,
        str(Path(comfyui_path) / "main.py"),
        "--listen",
        "127.0.0.1",
        "--port",
        str(port),
        "--disable-auto-launch",
    ]
    if cpu:
        argv.append("--cpu")
    return argv + list(extra)


@dataclass(frozen=True, slots=True)
class Memory:
    """ComfyUI's primary device and host memory, in MiB, as `/system_stats` reports them."""

    device: str
    device_type: str
    total_mb: int
    free_mb: int
    ram_total_mb: int
    ram_free_mb: int

    @classmethod
    def of(cls, stats: SystemStats) -> Memory:
        d = stats.primary
        return cls(
            d.name if d else "none",
            d.type if d else "none",
            (d.vram_total if d else 0) // MB,
            (d.vram_free if d else 0) // MB,
            stats.ram_total // MB,
            stats.ram_free // MB,
        )


@dataclass(frozen=True, slots=True)
class ServerStatus:
    queue: QueueState
    memory: Memory

    def to_json(self) -> dict[str, object]:
        """What the runner's capabilities show of this ComfyUI."""
        return {
            "queueDepth": self.queue.depth,
            "queueRunning": len(self.queue.running),
            "queuePending": len(self.queue.pending),
            "runningPromptId": self.queue.running[0] if self.queue.running else None,
            "device": self.memory.device,
            "gpuMemoryTotalMB": self.memory.total_mb,
            "gpuMemoryFreeMB": self.memory.free_mb,
            "gpuMemoryUsedMB": max(0, self.memory.total_mb - self.memory.free_mb),
        }


class ComfyUIServer:
    """One ComfyUI server; its models share it (and its FIFO queue)."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        process: EngineProcess | None = None,
        comfyui_path: str | None = None,
    ) -> None:
        self.http = http
        self.client = ComfyUIClient(http)
        self.process = process
        self.comfyui_path = comfyui_path
        self._started = False
        self._lock = asyncio.Lock()

    @classmethod
    def spawn(
        cls,
        comfyui_path: str,
        *,
        python: str = sys.executable,
        cpu: bool = False,
        extra_args: Sequence[str] = (),
        load_timeout_s: float = 300.0,
        request_timeout_s: float = 60.0,
    ) -> ComfyUIServer:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        http = httpx.AsyncClient(base_url=url, timeout=request_timeout_s, trust_env=False)

        async def healthy() -> bool:
            response = await http.get("/system_stats", timeout=2.0)
            return response.status_code == 200

        process = EngineProcess(
            name="comfyui",
            argv=command_line(python, comfyui_path, port, cpu, extra_args),
            health=healthy,
            env={"PYTHONUNBUFFERED": "1"},
            load_timeout_s=load_timeout_s,
            poll_interval_s=0.25,
        )
        return cls(http, process, comfyui_path)

    @classmethod
    def attach(
        cls, url: str, *, comfyui_path: str | None = None, request_timeout_s: float = 60.0
    ) -> ComfyUIServer:
        http = httpx.AsyncClient(base_url=url, timeout=request_timeout_s, trust_env=False)
        return cls(http, None, comfyui_path)

    @property
    def url(self) -> str:
        return self.client.base_url

    @property
    def checkpoints_dir(self) -> Path | None:
        """Where ComfyUI reads checkpoints from (known when its path is configured)."""
        return Path(self.comfyui_path) / "models" / "checkpoints" if self.comfyui_path else None

    @property
    def failure(self) -> str | None:
        """How the spawned process died, when it did."""
        exit_info = self.process.exit if self.process is not None else None
        if exit_info is not None and not exit_info.expected:
            return f"ComfyUI exited ({exit_info.describe()})"
        return None

    async def start(self) -> None:
        """Spawn and wait until healthy, or check the attached server answers; once."""
        async with self._lock:
            if self._started:
                return
            if self.process is not None:
                await self.process.start()
            else:
                await self.client.system_stats()
            self._started = True
            log.info("ComfyUI ready at %s", self.url)

    async def stop(self) -> None:
        if self.process is not None:
            await self.process.stop()
        await self.http.aclose()
        self._started = False

    async def status(self) -> ServerStatus:
        queue, stats = await asyncio.gather(self.client.queue(), self.client.system_stats())
        return ServerStatus(queue, Memory.of(stats))
