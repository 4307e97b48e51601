"""How a model's engine is started: its kind attaches it (`url`) or starts it, on the GPUs
the accounting places it on (`gpus.GpuAccounting`), with the LoRA adapters of its base
whose files check out (`runner/engines/adapters.AdapterBook.check_files`); and how much
memory a started engine holds. The pool (`pool.ModelPool`) decides when; this is how.
"""

from __future__ import annotations

import asyncio

from adapters.kind import Devices
from adapters.launched import Launched
from runner.engines.adapters import AdapterBook
from runner.engines.gpus import EngineHost, GpuAccounting
from runner.engines.kinds import EngineKinds, LoadParams
from runner.engines.record import EngineRecord
from runner.engines.sizing import estimate_for
from runner.floor.models_file import ModelSpec


class Launcher:
    def __init__(
        self, kinds: EngineKinds, gpus: GpuAccounting, host: EngineHost, adapters: AdapterBook
    ) -> None:
        self.kinds = kinds
        self.gpus = gpus
        self.host = host
        self.adapters = adapters

    async def launch(self, spec: ModelSpec, params: LoadParams) -> Launched:
        """Attached by its kind, or started: placed on GPUs unless the kind runs it
        elsewhere (a speech worker on the CPU), with its base's active adapters."""
        kind = self.kinds.of(spec)
        if spec.attached:
            return await kind.attach(self.kinds.engine_spec(spec, params), self.host)
        adapters = await asyncio.to_thread(self.adapters.check_files, spec.id)
        engine = self.kinds.engine_spec(spec, params, adapters)
        if not kind.placed(engine):
            return await kind.start(engine, Devices(), self.host)
        budget = params.gpu_memory_budget_mb
        devices = await self.gpus.devices_for(spec, estimate_for(spec, self.kinds, budget))
        return await kind.start(engine, devices, self.host)

    async def measure(self, record: EngineRecord) -> int:
        """MiB the model's engine process holds (its `vram_mb` when it has none here)."""
        process = record.process
        if process is None or process.pid is None:
            return record.spec.vram_mb or 0
        return await self.host.measure_mb(process.pid)

    async def started_mb(self, record: EngineRecord) -> int:
        """What the model's just-started engine holds: what its launch measured itself,
        else what its process holds (`measure`)."""
        launched = record.launched
        measured = launched.memory_mb if launched is not None else None
        return measured if measured is not None else await self.measure(record)
