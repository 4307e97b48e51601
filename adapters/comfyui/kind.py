"""ComfyUI as an engine kind: one server per runner, its models the checkpoints and
workflows on it, served on the image path.

- Server: spawned from COMFYUI_PATH (`COMFYUI_PYTHON <path>/main.py --listen 127.0.0.1
  --port P --disable-auto-launch [--cpu]`, COMFYUI_CPU) the first time a ComfyUI model
  without a `url` loads, and again after it died; or attached: every model with the same
  `url` shares that ComfyUI.
- Model load (`ComfyUIKind.start`, and `attach` for a model with a `url`): the server
  started, the checkpoint present in ComfyUI's `checkpoints` folder (copied from the model's
  `path`, or downloaded from its `hf` repo, when missing), a warm-up prompt succeeded
  (`adapters/comfyui/engine.py`); the memory it took is ComfyUI's free device memory before
  minus after (`/system_stats`).
- Model unload (`Launched.release`): `POST /free`, and the memory `/system_stats` shows
  freed after it. The server keeps running; it stops with the runner (`close`).
- Slots: every model on one server shares its one queue (`slot_group`: `comfyui:<url>`,
  or `comfyui:spawned`); its queue (`/queue`) and version (`/system_stats`) are read
  once per server; a probe asks `/system_stats`.
- Requests: the images facet (`adapters/comfyui/facet.py`) on the kind's one
  `ImageGenerator`; a model not loaded yet is checked against its workflow
  (`image_shape`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from adapters.comfyui.engine import CheckpointFetcher, ComfyUIEngine
from adapters.comfyui.facet import ComfyImages, ComfyShape
from adapters.comfyui.follow import FollowTiming
from adapters.comfyui.images import ImageGenerator
from adapters.comfyui.server import COMFYUI_ENVIRONMENT, ComfyUIServer, Memory
from adapters.comfyui.settings import ComfyUIOptions, ComfyUISettings
from adapters.comfyui.template_checks import load_template
from adapters.comfyui.workflows import WorkflowTemplate
from adapters.kind import Devices, EngineSettings, EngineSpec, Host, KindDefaults, Traits
from adapters.launched import EngineLoad, Launched
from adapters.supervisor import EngineState
from faults import ConfigError

log = logging.getLogger("quorum.pool")

DEFAULT_WORKFLOW = "txt2img"


class ComfyUIServers:
    """The ComfyUI servers of one runner: the one it spawns, and those attached by URL."""

    def __init__(self, settings: EngineSettings, own: ComfyUISettings) -> None:
        self.settings = settings
        self.own = own
        self._spawned: ComfyUIServer | None = None
        self._attached: dict[str, ComfyUIServer] = {}
        self._retired: list[ComfyUIServer] = []

    def server_for(self, spec: EngineSpec) -> ComfyUIServer:
        """The server `spec` runs on (created on first use; a dead spawned one replaced)."""
        s, own = self.settings, self.own
        if spec.url is not None:
            url = spec.url.rstrip("/")
            if url not in self._attached:
                self._attached[url] = ComfyUIServer.attach(url, comfyui_path=own.path)
            return self._attached[url]
        if own.path is None:
            raise ConfigError(
                f"model {spec.model_id!r}: backend comfyui needs COMFYUI_PATH (to start ComfyUI) "
                "or a url (to attach one)"
            )
        if self._spawned is not None and _dead(self._spawned):
            self._retired.append(self._spawned)
            self._spawned = None
        if self._spawned is None:
            self._spawned = ComfyUIServer.spawn(
                own.path,
                python=own.python or sys.executable,
                cpu=own.cpu,
                load_timeout_s=spec.load_timeout_s or s.load_timeout_s,
                request_timeout_s=s.read_timeout_s,
                metadata=own.image_metadata,
                logs_of=spec.model_id,
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


def checkpoint_fetcher(spec: EngineSpec) -> CheckpointFetcher | None:
    """Where a checkpoint missing from ComfyUI's folder comes from: the model's `path` (a
    local file, linked or copied in), else its `hf` repository (downloaded into the folder
    with huggingface_hub); neither: nothing is fetched."""
    source = spec.path
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


async def start_comfyui(
    spec: EngineSpec, servers: ComfyUIServers, generator: ImageGenerator | None = None
) -> Launched:
    """Start (or reach) `spec`'s ComfyUI and load the model on it (see the module docstring)."""
    own = ComfyUIOptions.of(spec.options)
    template = load_template(own.workflow or DEFAULT_WORKFLOW)
    if "checkpoint" in template.params and not own.checkpoint:
        raise ConfigError(f"model {spec.model_id!r}: workflow {template.name!r} needs a checkpoint")
    server = servers.server_for(spec)
    await server.start()
    before = Memory.of(await server.client.system_stats())
    engine = ComfyUIEngine(
        spec.model_id,
        server,
        template,
        own.checkpoint,
        slots=spec.slots,
        fetch=checkpoint_fetcher(spec),
        timing=FollowTiming(silence_s=servers.settings.read_timeout_s),
    )
    try:
        report = await engine.load()
    except BaseException:
        engine.http.close()
        raise

    async def release() -> int:
        return (await engine.unload()).freed_mb

    used = max(0, before.free_mb - report.memory.free_mb)
    return launched(engine, generator, release=release, memory_mb=used)


def launched(
    engine: ComfyUIEngine,
    generator: ImageGenerator | None = None,
    release: Callable[[], Awaitable[int]] | None = None,
    memory_mb: int | None = None,
) -> Launched:
    """What a ComfyUI model can do, for the pool: its server's queue and version are read
    once per server (`server`), its process watched, never stopped with the model; its
    images generated by `generator` (None: one of its own)."""
    server = engine.server

    async def load() -> EngineLoad:
        queue = await engine.client.queue()
        return EngineLoad(waiting=len(queue.pending), running=len(queue.running))

    async def version() -> str | None:
        stats = await engine.client.system_stats()
        return stats.comfyui_version if stats.comfyui_version != "unknown" else None

    return Launched(
        engine,
        None,
        url=server.url,
        shared=server.process,
        release=release,
        memory_mb=memory_mb,
        images=ComfyImages(engine, generator or ImageGenerator(timing=engine.timing)),
        flush=engine.flush,
        load=load,
        version=version,
        server=server,
    )


class ComfyUIKind(KindDefaults):
    name = "comfyui"
    traits = Traits(
        request_path="images",
        default_parallel=1,
        probe_path="/system_stats",
        options=ComfyUIOptions,
        environment=COMFYUI_ENVIRONMENT,
        error_tables=("adapters.comfyui.errors",),
    )

    def __init__(self, settings: EngineSettings) -> None:
        super().__init__(settings)
        self.own = ComfyUISettings.read(settings.environ)
        self.servers = ComfyUIServers(settings, self.own)
        self.generator = ImageGenerator(
            timing=FollowTiming(silence_s=settings.read_timeout_s),
            keep_metadata=self.own.image_metadata,
        )

    def check(self, spec: EngineSpec) -> None:
        """A `path` beside a `url` is the checkpoint's source, not the model's engine."""

    def slot_group(self, spec: EngineSpec) -> str | None:
        """Every model on one server shares its one queue: `comfyui:<url>` for a server
        attached by `url`, `comfyui:spawned` for the one the runner starts
        (`ComfyUIServers.server_for` keys its servers the same way)."""
        url = spec.url.rstrip("/") if spec.url else None
        return f"comfyui:{url or 'spawned'}"

    def image_shape(self, spec: EngineSpec) -> ComfyShape | None:
        """`spec`'s workflow and checkpoint, before it is loaded (None: its workflow does
        not load; its load fails and says why)."""
        own = ComfyUIOptions.of(spec.options)
        template = _template(own.workflow or DEFAULT_WORKFLOW)
        if template is None:
            return None
        return ComfyShape(spec.model_id, template, own.checkpoint, self.generator)

    async def start(self, spec: EngineSpec, devices: Devices, host: Host) -> Launched:
        return await start_comfyui(spec, self.servers, self.generator)

    async def attach(self, spec: EngineSpec, host: Host) -> Launched:
        return await start_comfyui(spec, self.servers, self.generator)

    def pids(self) -> list[int]:
        return self.servers.pids()

    async def close(self) -> None:
        await self.servers.close()


@functools.lru_cache(maxsize=64)
def _template(workflow: str) -> WorkflowTemplate | None:
    try:
        return load_template(workflow)
    except ConfigError:  # its load fails and says why; nothing to check against here
        return None
