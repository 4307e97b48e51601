"""ComfyUI as an engine: one server (started by the runner or attached by URL), and one
`ComfyUIEngine` per model id = one checkpoint and one workflow template on that server.

The server (spawned or attached) is `server.ComfyUIServer`.

Model (`ComfyUIEngine`), states and their guarded transitions::

    UNLOADED ──load()──▶ LOADING ──▶ LOADED ──unload()──▶ UNLOADING ──▶ UNLOADED
        ▲                   │                                  │
        └──── load() ─── FAILED ◀──────────────────────────────┘  (on an error)

- load: the checkpoint must be in ComfyUI's `checkpoints` folder as ComfyUI itself lists it
  (`GET /models/checkpoints`; ComfyUI refuses an unlisted one with "Value not in list");
  a missing one is fetched into `<COMFYUI_PATH>/models/checkpoints` by the `fetch` hook
  when one is given, then looked up again; then a warm-up prompt (the model's template at
  its smallest size, one step) must succeed, so the checkpoint is in memory;
- unload: `POST /free {unload_models, free_memory}`. ComfyUI only sets flags that its
  worker applies after the running prompt, and answers nothing about them, so the report
  is what `/system_stats` shows before and after (polled until the free memory moves or
  `settle_s` passes). ComfyUI unloads every model it holds, not only this checkpoint;
  the others load again on their next use.
- flush: `flushed: false`, "ComfyUI has no KV cache". What it does keep is a node-output
  cache: a node whose inputs equal those of a node in an earlier prompt is not run again
  (only a request with the same prompt *and* seed can hit another's entry; seeds are
  random unless the client sends `x_seed`). `free_memory` on unload empties it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters.base import CacheReport, FlushResult, FlushScope, NoPlacement
from adapters.comfyui.client import ComfyUIClient
from adapters.comfyui.errors import ComfyUINotReady, ExecutionFailed
from adapters.comfyui.follow import FollowTiming, run
from adapters.comfyui.server import (
    JOBS_FOLDER,
    ComfyUIServer,
    Memory,
    ServerStatus,
    job_folders,
)
from adapters.comfyui.workflows import WorkflowTemplate
from adapters.errors import EngineError, IllegalEngineTransition, UnsupportedRequest
from adapters.http_client import EngineConnections
from faults import QuorumError

log = logging.getLogger("quorum.comfyui")

NO_KV_CACHE = "ComfyUI has no KV cache"

CheckpointFetcher = Callable[[str, Path], Awaitable[None]]
"""`fetch(checkpoint_name, checkpoints_dir)`: put the file there (e.g. from Hugging Face)."""


class ComfyModelState(enum.Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"
    FAILED = "failed"


_ALLOWED: dict[ComfyModelState, frozenset[ComfyModelState]] = {
    ComfyModelState.UNLOADED: frozenset({ComfyModelState.LOADING}),
    ComfyModelState.LOADING: frozenset({ComfyModelState.LOADED, ComfyModelState.FAILED}),
    ComfyModelState.LOADED: frozenset({ComfyModelState.UNLOADING}),
    ComfyModelState.UNLOADING: frozenset({ComfyModelState.UNLOADED, ComfyModelState.FAILED}),
    ComfyModelState.FAILED: frozenset({ComfyModelState.LOADING}),
}


@dataclass(frozen=True, slots=True)
class LoadReport:
    checkpoint: str | None
    fetched: bool
    warmup_ms: int
    memory: Memory


@dataclass(frozen=True, slots=True)
class UnloadReport:
    before: Memory
    after: Memory

    @property
    def freed_mb(self) -> int:
        return max(0, self.after.free_mb - self.before.free_mb)

    def to_json(self) -> dict[str, object]:
        return {
            "gpuMemoryFreeMBBefore": self.before.free_mb,
            "gpuMemoryFreeMBAfter": self.after.free_mb,
            "memoryFreedMB": self.freed_mb,
            "device": self.after.device,
        }


@dataclass(eq=False)
class ComfyUIEngine(NoPlacement):
    """One model (checkpoint + template) on a ComfyUI server.

    It also meets the data path's `Engine` protocol, so it can sit in the runner's engine
    map: chat/completions/embeddings requests for it are refused with a 400 before they
    are queued (`rewrite`), and a cache flush answers that there is nothing to flush.
    `http` is a connection pool that stays unused for that reason.
    """

    model_id: str
    server: ComfyUIServer
    template: WorkflowTemplate
    checkpoint: str | None = None
    slots: int = 1
    fetch: CheckpointFetcher | None = None
    timing: FollowTiming = field(default_factory=FollowTiming)
    clock: Callable[[], float] = time.monotonic
    state: ComfyModelState = field(default=ComfyModelState.UNLOADED, init=False)

    def __post_init__(self) -> None:
        self.http = EngineConnections(self.server.url, 5.0, 60.0)
        self.base_url = self.server.url
        self._failure: str | None = None
        self.cut: QuorumError | None = None  # (the image path answers its own failures)

    # -- reading ---------------------------------------------------------------------

    @property
    def client(self) -> ComfyUIClient:
        return self.server.client

    @property
    def failure(self) -> str | None:
        """How the server died (or what the runner recorded about it), else None."""
        return self._failure or self.server.failure

    @failure.setter
    def failure(self, value: str | None) -> None:
        self._failure = value

    def ensure_ready(self) -> None:
        if self.state is not ComfyModelState.LOADED:
            raise ComfyUINotReady(f"model {self.model_id!r} is {self.state.value}")
        failure = self.server.failure
        if failure is not None:
            raise ComfyUINotReady(f"model {self.model_id!r}: {failure}")

    # -- lifecycle -------------------------------------------------------------------

    def _move(self, to: ComfyModelState) -> None:
        if to not in _ALLOWED[self.state]:
            raise IllegalEngineTransition(
                f"model {self.model_id!r}: {self.state.value} -> {to.value} is not allowed"
            )
        self.state = to

    async def load(self) -> LoadReport:
        """Make the model servable; see the module docstring.

        1. LOADING; the server started (spawned and healthy, or attached and answering).
        2. The checkpoint listed by ComfyUI, fetched first when missing and a hook exists.
        3. A warm-up prompt succeeded. 4. LOADED, with the memory ComfyUI reports.
        Any failure: FAILED, and the error goes to the caller.
        """
        self._move(ComfyModelState.LOADING)  # 1
        try:
            await self.server.start()
            fetched = await self._ensure_checkpoint()  # 2
            started = self.clock()
            await self._warm_up()  # 3
            warmup_ms = round((self.clock() - started) * 1000)
            memory = Memory.of(await self.client.system_stats())
        except BaseException:
            self._move(ComfyModelState.FAILED)
            raise
        self._move(ComfyModelState.LOADED)  # 4
        log.info("model %s loaded on ComfyUI (warm-up %d ms)", self.model_id, warmup_ms)
        return LoadReport(self.checkpoint, fetched, warmup_ms, memory)

    async def _ensure_checkpoint(self) -> bool:
        if self.checkpoint is None or "checkpoint" not in self.template.params:
            return False
        if self.checkpoint in await self.client.models("checkpoints"):
            return False
        folder = self.server.checkpoints_dir
        if self.fetch is None or folder is None:
            raise ComfyUINotReady(
                f"checkpoint {self.checkpoint!r} is not in ComfyUI's checkpoints folder"
                + ("" if folder is None else f" ({folder})")
                + " and nothing is configured to fetch it"
            )
        folder.mkdir(parents=True, exist_ok=True)
        await self.fetch(self.checkpoint, folder)
        if self.checkpoint not in await self.client.models("checkpoints"):
            raise ComfyUINotReady(
                f"checkpoint {self.checkpoint!r} was fetched into {folder} but ComfyUI "
                "does not list it (is COMFYUI_PATH the folder ComfyUI runs from?)"
            )
        return True

    async def _warm_up(self) -> None:
        token = secrets.token_hex(8)
        prefix = f"{JOBS_FOLDER}/{token}/warmup"
        graph = self.template.render(warmup_values(self.template, self.checkpoint, prefix))
        try:
            finished = await run(self.client, graph, timing=self.timing)
        finally:
            for folder in job_folders(graph, token):
                await self.server.discard(folder)
        with contextlib.suppress(EngineError):
            await self.client.delete_history([finished.prompt_id])
        if finished.outcome.verdict != "success":
            failure = finished.outcome.failure
            detail = failure.describe() if failure else finished.outcome.verdict
            raise ExecutionFailed(f"warm-up of model {self.model_id!r} failed: {detail}")

    async def unload(
        self,
        settle_s: float = 5.0,
        poll_s: float = 0.1,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> UnloadReport:
        """`POST /free`, then what `/system_stats` shows (see the module docstring).

        1. UNLOADING; read the memory before.
        2. Ask ComfyUI to unload its models and free its caches.
        3. Read `/system_stats` every `poll_s` until the free memory moved or `settle_s`
           passed (ComfyUI does not say when it is done); the last reading is the report.
        4. UNLOADED (FAILED if ComfyUI could not be asked).
        """
        self._move(ComfyModelState.UNLOADING)  # 1
        try:
            before = Memory.of(await self.client.system_stats())
            await self.client.free(unload_models=True, free_memory=True)  # 2
            deadline = self.clock() + settle_s
            after = Memory.of(await self.client.system_stats())  # 3
            while after.free_mb == before.free_mb and self.clock() < deadline:
                await sleep(poll_s)
                after = Memory.of(await self.client.system_stats())
        except BaseException:
            self._move(ComfyModelState.FAILED)
            raise
        self._move(ComfyModelState.UNLOADED)  # 4
        report = UnloadReport(before, after)
        log.info(
            "model %s unloaded: ComfyUI free memory %d -> %d MiB",
            self.model_id,
            before.free_mb,
            after.free_mb,
        )
        return report

    async def status(self) -> ServerStatus:
        """Queue depth, running prompt and memory of this model's ComfyUI."""
        return await self.server.status()

    # -- the data path's Engine protocol -----------------------------------------------

    def rewrite(self, body: dict[str, Any], cache_mode: str, tenant: str) -> bool:
        raise UnsupportedRequest(
            f"model {self.model_id!r} generates images: use POST /v1/images/generations"
        )

    def report(self, response: dict[str, Any]) -> CacheReport:
        return CacheReport()

    async def diagnose(self) -> str | None:
        return self.failure

    # -- what image generation needs besides the client (images.ImageModel) --------------

    async def died_within(self, seconds: float) -> str | None:
        """How ComfyUI died, if its process ends within `seconds`; None if it lives on."""
        return await self.server.died_within(seconds)

    async def discard_outputs(self, folder: str) -> bool:
        """Remove a job's output folder from ComfyUI's output folder."""
        return await self.server.discard(folder)

    async def flush(self, scope: FlushScope) -> FlushResult:
        return FlushResult(False, reason=NO_KV_CACHE)

    # -- the runner's Engine protocol (adapters/base.py) ---------------------------------

    def lost(self, reason: str) -> None:
        self.failure = reason
        self.http.close()

    async def stop(self, grace_s: float) -> None:
        self.http.close()  # the server is shared: it stops with the runner (kind.close)


def warmup_values(
    template: WorkflowTemplate, checkpoint: str | None, prefix: str
) -> dict[str, Any]:
    """The cheapest values the template accepts: smallest size near 64 px, one image, one
    step, a fixed seed, the first choice of a fixed-choice text, the warm-up's own
    `prefix` (pure)."""
    params = template.params
    values: dict[str, Any] = {"filename_prefix": prefix}
    for name in ("width", "height"):
        p = params.get(name)
        if p is not None:
            size = max(int(p.minimum or 1), 64)
            if p.multiple_of:
                size -= size % p.multiple_of
            if p.maximum is not None:
                size = min(size, int(p.maximum))
            values[name] = size
    fixed = {"batch_size": 1, "steps": 1, "seed": 0, "prompt": "warm-up"}
    values.update({k: v for k, v in fixed.items() if k in params})
    for name, param in params.items():  # a fixed-choice text takes its first choice
        if param.choices and name != "filename_prefix":
            values[name] = param.choices[0]
    if "checkpoint" in params and checkpoint is not None:
        values["checkpoint"] = checkpoint
    return values
