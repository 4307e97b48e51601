"""ComfyUI for the pool: one server per runner, its models the checkpoints and workflows on it.

- Server: spawned from COMFYUI_PATH (`COMFYUI_PYTHON <path>/main.py --listen 127.0.0.1
  --port P --disable-auto-launch [--cpu]`, COMFYUI_CPU) the first time a ComfyUI model
  without a `url` loads, and again after it died; or attached: every model with the same
  `url` shares that ComfyUI.
- Model load (`start_comfyui`): the server started, the checkpoint present in ComfyUI's
  `checkpoints` folder (copied from the model's `path`, or downloaded from its `hf` repo,
  when missing), a warm-up prompt succeeded (`adapters/comfyui/engine.py`); the memory it
  took is ComfyUI's free device memory before minus after (`/system_stats`).
- Model unload (`Launched.release`): `POST /free`, and the memory `/system_stats` shows
  freed after it. The server keeps running; it stops with the runner.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
from pathlib import Path

from adapters.comfyui.engine import CheckpointFetcher, ComfyUIEngine
from adapters.comfyui.follow import FollowTiming
from adapters.comfyui.server import ComfyUIServer, Memory
from adapters.comfyui.workflows import load_template
from adapters.supervisor import EngineState
from runner.engines.launch import Launched
from runner.errors import ConfigError
from runner.runtime.models_file import ModelSpec
from runner.runtime.settings import Settings

log = logging.getLogger("quorum.pool")

DEFAULT_WORKFLOW = "txt2img"


class ComfyUIServers:
    """The ComfyUI servers of one runner: the one it spawns, and those attached by URL."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._spawned: ComfyUIServer | None = None
        self._attached: dict[str, ComfyUIServer] = {}
        self._retired: list[ComfyUIServer] = []

    def server_for(self, spec: ModelSpec) -> ComfyUIServer:
        """The server `spec` runs on (created on first use; a dead spawned one replaced)."""
        s = self.settings
        if spec.url is not None:
            url = spec.url.rstrip("/")
            if url not in self._attached:
                self._attached[url] = ComfyUIServer.attach(url, comfyui_path=s.comfyui_path)
            return self._attached[url]
        if s.comfyui_path is None:
            raise ConfigError(
                f"model {spec.id!r}: backend comfyui needs COMFYUI_PATH (to start ComfyUI) "
                "or a url (to attach one)"
            )
        if self._spawned is not None and _dead(self._spawned):
            self._retired.append(self._spawned)
            self._spawned = None
        if self._spawned is None:
            self._spawned = ComfyUIServer.spawn(
                s.comfyui_path,
                python=s.comfyui_python or sys.executable,
                cpu=s.comfyui_cpu,
                load_timeout_s=spec.load_timeout_s or s.engine_load_timeout_s,
                request_timeout_s=s.engine_read_timeout_s,
                metadata=s.comfyui_image_metadata,
                logs_of=spec.id,
            )
        return self._spawned

    def pids(self) -> list[int]:
        server = self._spawned
        process = server.process if server is not None else None
        return [process.pid] if process is not None and process.pid is not None else []

    async def close(self) -> None:
        servers = [*self._retired, *self._attached.values()]
        if self._spawned is not None:
            servers.append(self._spawned)
        for server in servers:
            await server.stop()
        self._spawned, self._attached, self._retired = None, {}, []


def _dead(server: ComfyUIServer) -> bool:
    process = server.process
    return process is not None and process.state in (EngineState.FAILED, EngineState.STOPPED)


def checkpoint_fetcher(spec: ModelSpec) -> CheckpointFetcher | None:
    """Where a checkpoint missing from ComfyUI's folder comes from: the model's `path` (a
    local file, linked or copied in), else its `hf` repository (downloaded into the folder
    with huggingface_hub); neither: nothing is fetched."""
    source = spec.local_path()
    repo = spec.hf
    if source is None and repo is None:
        return None

    async def fetch(name: str, folder: Path) -> None:
        target = folder / name
        if source is not None:
            await asyncio.to_thread(_link_or_copy, source, target)
            return
        assert repo is not None

        def download() -> None:
            from huggingface_hub import hf_hub_download

            hf_hub_download(repo_id=repo, filename=name, local_dir=str(folder))

        try:
            await asyncio.to_thread(download)
        except Exception as exc:  # huggingface_hub's errors, translated here once
            raise ConfigError(
                f"checkpoint {name!r} could not be downloaded from {repo}: "
                f"{type(exc).__name__}: {str(exc)[:300]}"
            ) from None
        log.info("checkpoint %s downloaded from %s into %s", name, repo, folder)

    return fetch


def _link_or_copy(source: Path, target: Path) -> None:
    if not source.is_file():
        raise ConfigError(f"checkpoint source {source} is not a file")
    tmp = target.with_name(target.name + ".part")
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    tmp.replace(target)


async def start_comfyui(spec: ModelSpec, servers: ComfyUIServers) -> Launched:
    """Start (or reach) `spec`'s ComfyUI and load the model on it (see the module docstring)."""
    template = load_template(spec.workflow or DEFAULT_WORKFLOW)
    if "checkpoint" in template.params and not spec.checkpoint:
        raise ConfigError(f"model {spec.id!r}: workflow {template.name!r} needs a checkpoint")
    server = servers.server_for(spec)
    await server.start()
    before = Memory.of(await server.client.system_stats())
    engine = ComfyUIEngine(
        spec.id,
        server,
        template,
        spec.checkpoint,
        slots=spec.slots,
        fetch=checkpoint_fetcher(spec),
        timing=FollowTiming(silence_s=servers.settings.engine_read_timeout_s),
    )
    try:
        report = await engine.load()
    except BaseException:
        engine.http.close()
        raise

    async def release() -> int:
        return (await engine.unload()).freed_mb

    used = max(0, before.free_mb - report.memory.free_mb)
    return Launched(engine, None, shared=server.process, release=release, memory_mb=used)
