"""How much memory each GPU really has for the next model. Pure: inputs in, figures out.

The two sources and what each one sees:

- The device's free memory (NVML) sees everything already allocated: our
  engines, other lease holders' processes, and users that hold no lease at all
  (a notebook, a desktop). It does not see memory promised but not allocated
  yet: a model still loading, a training job about to start.
- The total minus every lease (ours and other holders') sees those promises,
  but trusts each holder's figure and misses users without a lease.

`free = min(device free, total - leased)`, never below 0. A loaded engine's
memory appears in both terms and the minimum takes it once, never twice. The
figure is exact when every holder uses at most what it leased. It errs:

1. On the safe side when a holder uses less than its lease (a conservative
   estimate): free is under-stated until the measured footprint replaces it.
2. On the unsafe side when one holder uses more than it leased while another
   has leased but not yet allocated: both terms over-state free. Replacing our
   estimates with measured footprints closes this for our engines; other
   holders must lease what they use.
3. With `BudgetTelemetry` the device's free memory is itself the budget minus
   our accounted use, so the figure is the budget minus every lease: what other
   host processes hold is not seen (`RUNNER_MEMORY_MB` is the operator's word
   for what the runner may use).

Leases on GPUs the snapshot does not list (devices hidden by
`CUDA_VISIBLE_DEVICES`) are ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from runner.memory.leases import Lease
from runner.memory.placement import DEFAULT_MARGIN_MB, GpuFree
from runner.memory.telemetry import GpuInfo


@dataclass(frozen=True, slots=True)
class GpuAccount:
    """One GPU's figures in MiB: the device's own, the sum of leases on it, and the
    free memory the runner plans with."""

    index: int
    total_mb: int
    device_free_mb: int
    leased_mb: int
    free_mb: int


def leased_per_gpu(leases: Iterable[Lease]) -> dict[int, int]:
    """MiB leased on each GPU index, summed over every holder."""
    totals: dict[int, int] = {}
    for lease in leases:
        for index, mb in lease.gpu_mb.items():
            totals[index] = totals.get(index, 0) + mb
    return totals


def account(gpus: Sequence[GpuInfo], leases: Iterable[Lease]) -> tuple[GpuAccount, ...]:
    """Each GPU's free memory for planning.

    1. Sum the leases per GPU index (every holder's, ours included).
    2. For each GPU of the snapshot: free = min(device free, total - leased), at least 0.
    """
    # 1. leases per GPU
    leased = leased_per_gpu(leases)
    # 2. the smaller of the two views
    return tuple(
        GpuAccount(
            index=gpu.index,
            total_mb=gpu.total_mb,
            device_free_mb=gpu.free_mb,
            leased_mb=leased.get(gpu.index, 0),
            free_mb=max(0, min(gpu.free_mb, gpu.total_mb - leased.get(gpu.index, 0))),
        )
        for gpu in gpus
    )


def free_gpus(accounts: Iterable[GpuAccount]) -> list[GpuFree]:
    """The accounts as `placement.place` takes them."""
    return [GpuFree(a.index, a.free_mb) for a in accounts]


def overcommitted(
    gpus: Sequence[GpuInfo], leases: Iterable[Lease], margin_mb: int = DEFAULT_MARGIN_MB
) -> list[int]:
    """GPUs whose leases, all holders together, leave less than `margin_mb` of the total.

    The check after acquiring: two holders that read the leases at the same time
    may both have placed on the same room; each finds the GPU here, releases, and
    tries again later.
    """
    leased = leased_per_gpu(leases)
    return [gpu.index for gpu in gpus if gpu.total_mb - leased.get(gpu.index, 0) < margin_mb]
