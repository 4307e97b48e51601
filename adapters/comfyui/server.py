"""One ComfyUI server, started by the runner or attached by URL (its models share it).

- spawned: `python <COMFYUI_PATH>/main.py --listen 127.0.0.1 --port <free port>
  --disable-auto-launch [--cpu]` under the supervisor (`EngineProcess`: own process group,
  log ring, dies with the runner). ComfyUI opens its port only after loading its nodes, so
  it is ready when `GET /system_stats` answers 200. Its folders (models, output) are those
  of `COMFYUI_PATH` (`folder_paths.py` takes them from main.py's own location).
- attached: an already running ComfyUI at a URL; ready when `/system_stats` answers.
  Give its `COMFYUI_PATH` too when checkpoints should be fetched into its folder.

Output folder: ComfyUI's `SaveImage` keeps every file it writes, forever, and (unless
started with `--disable-metadata`) puts the whole graph in each PNG. A spawned server gets
`--disable-metadata` unless `metadata=True`. Each job saves into a folder of its own
(`quorum/<job>/`), which `discard` removes once the job is answered; the output folder is
read from ComfyUI's argv (`--output-directory`, `--base-directory`; `/system_stats` shows
an attached server's), else `<COMFYUI_PATH>/output`. An attached ComfyUI on another machine
keeps its files: the runner cannot reach them (docs/engines.md).

A spawned server that dies is told apart from one that stops answering (`died_within`):
a request cut by the crash reports the exit code or signal, not a bare connection error.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from adapters.comfyui.client import ComfyUIClient, QueueState, SystemStats
from adapters.supervisor import EngineProcess, free_port

log = logging.getLogger("quorum.comfyui")

MB = 1024 * 1024
COMFYUI_ENVIRONMENT = ("TORCH_*", "PYTORCH_*", "HF_*")
"""What ComfyUI (and its custom nodes) take of the runner's environment
(`Traits.environment`)."""
JOBS_FOLDER = "quorum"
"""The output subfolder under which each job saves into `quorum/<job token>/`."""
_JOB_TOKEN = re.compile(r"[0-9a-f]{16}")


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


def output_folder(argv: Sequence[str], comfyui_path: str | None) -> Path | None:
    """Where ComfyUI's `SaveImage` writes, from its argv (pure; `folder_paths.py`).

    1. `--output-directory DIR` (absolute): DIR.
    2. `--base-directory DIR` (absolute): DIR/output.
    3. `comfyui_path` given: <path>/output (ComfyUI's default: next to its main.py).
    4. Otherwise unknown: None. (Relative paths depend on ComfyUI's working directory.)
    """
    for flag, suffix in (("--output-directory", ""), ("--base-directory", "output")):  # 1, 2
        if flag in argv[:-1]:
            value = argv[list(argv).index(flag) + 1]
            return Path(value) / suffix if os.path.isabs(value) else None
    return Path(comfyui_path) / "output" if comfyui_path else None  # 3, 4


def job_folders(graph: Mapping[str, Any], token: str) -> set[str]:
    """The output subfolders only this job writes to (pure): for every `filename_prefix`
    in the rendered `graph` (SaveImage's), the part of its directory that ends with the
    job's `token` (`quorum/<token>` for the built-in templates)."""
    folders = set()
    for node in graph.values():
        inputs = node.get("inputs") if isinstance(node, Mapping) else None
        prefix = inputs.get("filename_prefix") if isinstance(inputs, Mapping) else None
        if not isinstance(prefix, str):
            continue
        parts = os.path.normpath(os.path.dirname(prefix)).split(os.sep)
        if token in parts:
            folders.add("/".join(parts[: parts.index(token) + 1]))
    return folders


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
        argv = process.argv if process is not None else ()
        self.output_dir = output_folder(argv, comfyui_path)
        self._started = False
        self._lock = asyncio.Lock()
        self._warned_no_output = False

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
        metadata: bool = False,
        logs_of: str | None = None,
    ) -> ComfyUIServer:
        """A ComfyUI started from `comfyui_path`; its PNGs carry no workflow unless
        `metadata` (ComfyUI's `--disable-metadata` otherwise). `logs_of`: a model whose
        logs endpoint shows the server's output (the one it is started for)."""
        port = free_port()
        if not metadata and "--disable-metadata" not in extra_args:
            extra_args = [*extra_args, "--disable-metadata"]
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
            inherit=COMFYUI_ENVIRONMENT,
            load_timeout_s=load_timeout_s,
            poll_interval_s=0.25,
            logs_of=logs_of,
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
                stats = await self.client.system_stats()
                self.output_dir = output_folder(stats.argv, None) or self.output_dir
            self._started = True
            log.info("ComfyUI ready at %s", self.url)

    async def stop(self) -> None:
        if self.process is not None:
            await self.process.stop()
        await self.http.aclose()
        self._started = False

    async def died_within(self, seconds: float) -> str | None:
        """ "ComfyUI exited (<how>)" if the spawned process ends within `seconds` (it was
        not asked to); None for an attached server or one that lives on."""
        if self.process is None:
            return None
        how = await self.process.died_within(seconds)
        return f"ComfyUI {how}" if how is not None else None

    async def discard(self, folder: str) -> bool:
        """Remove a job's output folder (`quorum/<job>` as `job_folders` gives it) and all
        ComfyUI saved in it; False when the output folder is unknown or it is not there.

        Only a folder inside the output folder whose last part is a job token is touched.
        """
        if self.output_dir is None:
            if not self._warned_no_output:
                self._warned_no_output = True
                log.warning(
                    "ComfyUI at %s: its output folder is unknown (attached without "
                    "COMFYUI_PATH or --output-directory), so generated files stay there",
                    self.url,
                )
            return False
        root = self.output_dir.resolve()
        path = (root / folder).resolve()
        if not _JOB_TOKEN.fullmatch(path.name) or root not in path.parents:
            log.warning("not removing %s: not a job folder inside %s", folder, root)
            return False
        return await asyncio.to_thread(_remove_tree, path)

    async def status(self) -> ServerStatus:
        queue, stats = await asyncio.gather(self.client.queue(), self.client.system_stats())
        return ServerStatus(queue, Memory.of(stats))


def _remove_tree(path: Path) -> bool:
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        log.warning("could not remove ComfyUI output %s: %s", path, exc)
        return False
    return True
