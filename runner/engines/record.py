"""What the pool holds of one model's engine: the spec it was started from, the engine while
it has one, and how its engine last ended.

These are engine facts, not the model's state: that is the scheduler's
(`runner/scheduler/models.py`); the models the runner knows are the catalog's
(`specs.ModelSpecs`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from adapters.launched import Launched
from adapters.supervisor import EngineProcess
from runner.engines.kinds import LoadParams
from runner.floor.models_file import ModelSpec


@dataclass
class EngineRecord:
    """One model in the pool: `launched` is its engine while it has one; `spec` and
    `params` what it was (last) started from."""

    spec: ModelSpec
    params: LoadParams = field(default_factory=LoadParams)
    launched: Launched | None = None
    asleep: bool = False  # vLLM's warm standby: the process lives, weights off the GPU
    loaded_at: int | None = None  # unix time the engine became ready
    mem_mb: int = 0  # measured when it became ready (or fell asleep)
    exit_code: int | None = None  # how its engine last ended unasked
    last_process: EngineProcess | None = None  # for its logs after a crash
    start_log: list[str] = field(default_factory=list)  # output of a start that failed
    loading: asyncio.Task[None] | None = None  # the start in progress

    @property
    def process(self) -> EngineProcess | None:
        return self.launched.process if self.launched else None

    @property
    def context_length(self) -> int | None:
        """The context its engine serves, where known (the load's, else the spec's)."""
        return self.params.max_context_length or self.spec.context_length


@dataclass(frozen=True, slots=True)
class UnloadResult:
    """What an unload reports: the memory it freed, measured."""

    model_id: str
    freed_mb: int
    kv_cache_flushed: bool
    mode: str = "stop"  # "sleep": vLLM's warm standby, the process kept
