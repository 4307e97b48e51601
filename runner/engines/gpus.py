"""Which GPUs an engine gets, the memory leases that tell other GPU users about it, and
what the runner lends engine kinds to start theirs (`EngineHost`).

The decisions are pure (`runner/memory/placement.place`, `runner/memory/accounting.account`);
`GpuAccounting` gathers their inputs (telemetry, every holder's leases in the state
store) and keeps each model's placement and lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from adapters.kind import Devices, EngineFamilies
from faults import QuorumError
from runner.floor.models_file import ModelSpec
from runner.memory.accounting import account, free_gpus
from runner.memory.leases import Lease, LeaseStore
from runner.memory.placement import GpuPlacement, NoFit, cuda_visible_devices, place, tensor_split
from runner.memory.telemetry import Telemetry
from runner.scheduler.errors import ModelDoesNotFit

log = logging.getLogger("quorum.pool")

LEASE_TTL_S = 30.0  # renewed every snapshot refresh (5 s); a dead runner's leases expire


class GpuAccounting:
    def __init__(
        self,
        telemetry: Telemetry,
        leases: LeaseStore,
        runner_id: str,
        cuda_visible_devices: str | None = None,
    ) -> None:
        """`runner_id` names this runner's leases; `cuda_visible_devices` is the runner's
        own CUDA_VISIBLE_DEVICES, an engine's when it is not placed on GPUs itself."""
        self.telemetry = telemetry
        self.leases = leases
        self.runner_id = runner_id
        self.cuda_visible_devices = cuda_visible_devices
        self.cached_leases: list[Lease] = []  # every holder's, as of the last refresh
        self._placements: dict[str, GpuPlacement] = {}

    def holder(self, model: str) -> str:
        return f"{self.runner_id}/{model}"

    async def devices_for(self, spec: ModelSpec, need_mb: int) -> Devices:
        """`CUDA_VISIBLE_DEVICES` (and the shares of a model split across GPUs) for the engine.

        1. The model names its GPUs (`gpus`): those.
        2. On GPUs (NVML, not the no-GPU budget): place `need_mb` on the accounted free
           memory (every holder's leases counted): one GPU when it fits (best fit), else
           split across GPUs in proportion to free memory, 512 MB margin each; no fit: 503
           with the figures.
        3. Otherwise the runner's own CUDA_VISIBLE_DEVICES, if set.
        """
        if spec.gpus is not None:  # 1
            return Devices({"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in spec.gpus)})
        snapshot = await asyncio.to_thread(self.telemetry.snapshot)
        if snapshot.source != "budget" and snapshot.gpus:  # 2
            leases = await self.leases.all()
            match place(need_mb, free_gpus(account(snapshot.gpus, leases))):
                case NoFit(reason=reason):
                    raise ModelDoesNotFit(model=spec.id, reason=reason)
                case placement:
                    self._placements[spec.id] = placement
            env = {
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "CUDA_VISIBLE_DEVICES": cuda_visible_devices(placement),
            }
            return Devices(env, tensor_split(placement) if placement.split else None)
        if self.cuda_visible_devices is not None:  # 3
            return Devices({"CUDA_VISIBLE_DEVICES": self.cuda_visible_devices})
        return Devices()

    async def hold(self, measured_mb: dict[str, int]) -> None:
        """Lease each model's measured memory in the state store (renewed every refresh),
        split over its GPUs as it was placed, so other GPU users sharing the store (training
        jobs, other runners) count it; then re-read everyone's leases."""
        for model, mem_mb in measured_mb.items():
            placement = self._placements.get(model)
            if placement is None:
                gpu_mb = {0: mem_mb}
            else:
                planned = sum(placement.per_gpu_mb.values()) or 1
                gpu_mb = {i: round(mem_mb * mb / planned) for i, mb in placement.per_gpu_mb.items()}
            await self.leases.acquire(self.holder(model), gpu_mb, LEASE_TTL_S)
        self.cached_leases = await self.leases.all()

    async def release(self, model: str) -> None:
        self._placements.pop(model, None)
        with contextlib.suppress(QuorumError):
            await self.leases.release(self.holder(model))

    def free_memory_mb(self) -> int:
        """Memory free for new loads now: each device's free, less what other holders
        lease beyond it (`runner/memory/accounting.account`), summed over devices."""
        try:
            snapshot = self.telemetry.snapshot()
        except QuorumError as exc:
            log.warning("memory telemetry failed: %s", exc)
            return 0
        mine = self.runner_id + "/"
        others = [lease for lease in self.cached_leases if not lease.holder.startswith(mine)]
        return sum(a.free_mb for a in account(snapshot.gpus, others))


@dataclass(frozen=True, slots=True)
class EngineHost:
    """What the runner lends engine kinds to start theirs (`adapters.kind.Host`)."""

    telemetry: Telemetry
    families: EngineFamilies

    async def measure_mb(self, pid: int) -> int:
        return await asyncio.to_thread(self.telemetry.process_used_mb, [pid])

    def gpu_total_mb(self, gpus: Sequence[int] | None) -> int | None:
        """The total memory of the GPU an engine runs on (the first of `gpus`, else the
        first visible; the budget pseudo-device without a GPU); None when telemetry fails."""
        try:
            snapshot = self.telemetry.snapshot()
            gpu = snapshot.gpu(gpus[0]) if gpus else snapshot.gpus[0]
        except (QuorumError, KeyError, IndexError):
            return None
        return gpu.total_mb
