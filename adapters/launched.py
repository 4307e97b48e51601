"""One engine as its kind hands it to the pool (`Launched`), with what it can do: the facets
the runner asks instead of naming a kind (sleep, flush, KV figures, adapters, saved
prompt states), and the data those facets answer with.
"""

from __future__ import annotations

import enum
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import httpx

from adapters.base import AdapterHost, ChatEngine, Engine, FlushResult, FlushScope
from adapters.images import ImagesEngine
from adapters.prompt_tokens import PromptCounter
from adapters.speech import SpeechEngine
from adapters.supervisor import EngineProcess
from faults import QuorumError


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """One engine's own figures at its last poll (what it does not report reads 0)."""

    kv_cache_mb: float = 0.0
    kv_cache_utilization: float = 0.0  # 0..1
    waiting: int = 0  # requests queued inside the engine
    running: int = 0  # requests the engine is executing


class Standby(enum.Enum):
    AWAKE = "awake"
    SLEEPING = "sleeping"


@dataclass(frozen=True, slots=True)
class StandbyReport:
    """Where a sleep or wake-up left the engine, and the memory measured right after."""

    standby: Standby
    level: int | None
    memory_mb: int | None  # from the engine's memory probe; None without one


class Sleeper(Protocol):
    """An engine that can sleep: its process kept, its weights off the GPU."""

    async def sleep(self, level: int = 1) -> StandbyReport: ...

    async def wake_up(self) -> StandbyReport: ...


@dataclass
class Launched:
    """One model's engine as its kind hands it to the pool, with what it can do.

    `process` is the engine process this model owns (stopped with it; None when attached
    by URL). `shared` is a process the model runs in without owning it (ComfyUI's
    server): watched for crashes, never stopped with the model; `release` then unloads the
    model from it and answers the MB that freed. `memory_mb` is what the launch measured
    itself (None: the pool measures `process`). `url` is where a probe asks (None: not
    over HTTP).

    Exactly one request path's facet is set (`chat`, `speech`, `images`: the kind's
    `Traits.request_path`). The others say what the engine can do, None when it cannot:
    `flush` its cache, `standby` (sleep and wake up), `kv` (the share of its KV cache in
    use, given the memory beyond its weights), `load` (its own queue and KV figures),
    `version`, `tokens` (counts a chat-path request's prompt tokens as the engine will:
    adapters/prompt_tokens.py), `adapters` (the LoRA adapters it serves: `AdapterHost`)
    and `saved` (the folder its engine saves tenants' prompt states in, which outlives
    it: a flush of the states at rest leaves it to the running engine,
    `EngineKind.flush_at_rest`); engines on one server share `server`, so its figures are
    read once.
    """

    engine: Engine
    process: EngineProcess | None
    url: str | None = None
    control: httpx.AsyncClient | None = None
    shared: EngineProcess | None = None
    release: Callable[[], Awaitable[int]] | None = None
    memory_mb: int | None = None
    scratch: str | None = None  # a private directory removed with the engine (slot caches)
    chat: ChatEngine | None = None
    tokens: PromptCounter | None = None  # counts a chat request's prompt as the engine will
    speech: SpeechEngine | None = None
    images: ImagesEngine | None = None
    flush: Callable[[FlushScope], Awaitable[FlushResult]] | None = None
    standby: Sleeper | None = None
    kv: Callable[[float], Awaitable[float]] | None = None
    load: Callable[[], Awaitable[EngineLoad]] | None = None
    version: Callable[[], Awaitable[str | None]] | None = None
    adapters: AdapterHost | None = None
    saved: Path | None = None
    server: object | None = None
    watched: bool = field(default=False, compare=False)  # the pool registered its callback

    @property
    def watch(self) -> EngineProcess | None:
        """The process whose death ends this model (its own, else the shared one)."""
        return self.process or self.shared

    @property
    def slots(self) -> int:
        return self.engine.slots

    def lost(self, reason: str) -> None:
        """The process died: requests still on the engine fail with `reason`."""
        self.engine.lost(reason)

    def cut(self, error: QuorumError | None) -> None:
        """The runner is about to stop (or put to sleep) the engine under the requests
        still on it: they are answered `error` rather than the connection loss (None: it
        serves again, after a wake-up)."""
        self.engine.cut = error

    async def close(self, grace_s: float) -> None:
        """Stop the engine (SIGTERM, `grace_s`, SIGKILL): its process ends, memory returns."""
        await self.engine.stop(grace_s)
        if self.control is not None:
            await self.control.aclose()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
