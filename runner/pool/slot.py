"""One model's place in the pool, and what a load or an unload reports."""

from __future__ import annotations

from dataclasses import dataclass, field

from adapters.supervisor import EngineProcess
from runner.models_config import ModelSpec
from runner.pool.launch import Launched, LoadParams
from runner.pool.states import ModelState, transition

UnloadMode = str  # "stop" | "sleep"


@dataclass
class ModelSlot:
    """One model's place in the pool."""

    spec: ModelSpec
    state: ModelState = ModelState.UNLOADED
    launched: Launched | None = None
    loaded_at: int | None = None
    mem_mb: int = 0
    error: str | None = None
    exit_code: int | None = None
    restarts: int = 0
    params: LoadParams = field(default_factory=LoadParams)
    unload_mode: UnloadMode = "stop"  # how the next stop of this model ends it

    def move(self, to: ModelState) -> None:
        self.state = transition(self.spec.id, self.state, to)

    @property
    def process(self) -> EngineProcess | None:
        return self.launched.process if self.launched else None


@dataclass(frozen=True, slots=True)
class LoadResult:
    model_id: str
    gpu_memory_mb: int
    load_ms: int


@dataclass(frozen=True, slots=True)
class UnloadResult:
    model_id: str
    freed_mb: int
    kv_cache_flushed: bool
    mode: str = "stop"  # "sleep": vLLM's warm standby, the process kept
