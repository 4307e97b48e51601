"""Where a model goes: one GPU when it fits, else a split across several. Pure.

The input is each GPU's free memory as accounted (`accounting.free_gpus`), the
output a `GpuPlacement` (GPU ids and MiB per GPU, the amounts to lease) or a
`NoFit` whose reason names the need and the free figures.

Why best fit, not most free: a model that fits one GPU goes to the GPU where it
leaves the least room, so the largest hole stays whole for the next large model;
that means fewer splits (which cost inter-GPU traffic on every token) and fewer
evictions. Its cost: two busy models may share a GPU's compute while another GPU
idles. `policy="most_free"` spreads instead, for compute-bound deployments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

DEFAULT_MARGIN_MB = 512
"""Kept free on every GPU a model uses: CUDA context, driver and allocator slack."""

Policy = Literal["best_fit", "most_free"]


@dataclass(frozen=True, slots=True)
class GpuFree:
    """One GPU's free memory as accounted, in MiB."""

    index: int
    free_mb: int


@dataclass(frozen=True, slots=True)
class GpuPlacement:
    """The GPUs a model uses, in index order, and the MiB it takes on each (the
    leases to acquire, margin excluded); `per_gpu_mb` sums to the need."""

    gpu_ids: tuple[int, ...]
    per_gpu_mb: Mapping[int, int]

    @property
    def split(self) -> bool:
        return len(self.gpu_ids) > 1


@dataclass(frozen=True, slots=True)
class NoFit:
    """Not enough memory on the visible GPUs, even split; `shortfall_mb` is how much
    more would be needed (what eviction would have to free)."""

    reason: str
    need_mb: int
    usable_mb: Mapping[int, int]
    shortfall_mb: int


def place(
    need_mb: int,
    gpus: Sequence[GpuFree],
    margin_mb: int = DEFAULT_MARGIN_MB,
    policy: Policy = "best_fit",
) -> GpuPlacement | NoFit:
    """Place a model needing `need_mb` MiB on `gpus`, keeping `margin_mb` free on each.

    1. Usable memory of each GPU = free - margin (never below 0).
    2. One GPU has room → that GPU: the one with the least usable memory that still
       fits (best fit), or the most (`most_free`); ties go to the lower index.
    3. The GPUs together have room → the fewest GPUs, largest first, whose usable
       memory covers the need; each takes a share in proportion to its usable
       memory (whole MiB, remainders to the largest), so none goes below its margin.
    4. Otherwise → `NoFit`, naming the need, each GPU's usable memory and the shortfall.
    """
    if need_mb < 1:
        raise ValueError(f"need_mb must be at least 1, not {need_mb}")
    if margin_mb < 0:
        raise ValueError(f"margin_mb must not be negative, not {margin_mb}")
    # 1. usable memory
    usable = {gpu.index: max(0, gpu.free_mb - margin_mb) for gpu in gpus}
    # 2. one GPU
    fitting = [index for index, room in usable.items() if room >= need_mb]
    if fitting:
        if policy == "best_fit":
            chosen = min(fitting, key=lambda i: (usable[i], i))
        else:
            chosen = min(fitting, key=lambda i: (-usable[i], i))
        return GpuPlacement((chosen,), {chosen: need_mb})
    # 3. a split over the fewest GPUs
    largest_first = sorted((i for i in usable if usable[i] > 0), key=lambda i: (-usable[i], i))
    picked: list[int] = []
    for index in largest_first:
        picked.append(index)
        if sum(usable[i] for i in picked) >= need_mb:
            shares = _proportional(need_mb, picked, usable)
            return GpuPlacement(tuple(shares), shares)
    # 4. impossible
    return _no_fit(need_mb, usable, margin_mb)


def _proportional(need_mb: int, picked: list[int], usable: Mapping[int, int]) -> dict[int, int]:
    """Shares of `need_mb` in proportion to usable memory, in index order; each share is
    at most its GPU's usable memory, and a GPU whose share rounds to 0 is left out."""
    room = sum(usable[i] for i in picked)
    shares = {i: need_mb * usable[i] // room for i in picked}
    left = need_mb - sum(shares.values())
    for index in picked:  # largest first: the remainder (< len(picked)) lands there
        extra = min(left, usable[index] - shares[index])
        shares[index] += extra
        left -= extra
    return {i: shares[i] for i in sorted(shares) if shares[i] > 0}


def _no_fit(need_mb: int, usable: Mapping[int, int], margin_mb: int) -> NoFit:
    total = sum(usable.values())
    if not usable:
        reason = f"needs {need_mb} MB; no GPU is visible"
    else:
        each = ", ".join(f"GPU {i} {usable[i]} MB" for i in sorted(usable))
        reason = (
            f"needs {need_mb} MB; free after a {margin_mb} MB margin per GPU: {each} "
            f"({total} MB in all), {need_mb - total} MB short"
        )
    return NoFit(reason, need_mb, dict(usable), need_mb - total)


def cuda_visible_devices(placement: GpuPlacement) -> str:
    """The engine's `CUDA_VISIBLE_DEVICES`: "0,1" (with `CUDA_DEVICE_ORDER=PCI_BUS_ID`)."""
    return ",".join(str(index) for index in placement.gpu_ids)


def tensor_split(placement: GpuPlacement) -> str:
    """The shares in `gpu_ids` order, as llama-server's `--tensor-split` takes them."""
    return ",".join(str(placement.per_gpu_mb[index]) for index in placement.gpu_ids)
