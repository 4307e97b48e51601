"""Which models make room for a model that must load (pure; never logs).

`plan` is asked "can `target` load now, and if not, what must go?" every time
the scheduler considers a load; most answers are not acted on at once, so it
decides and returns a value, and the scheduler logs once when it commits
(llama-swap's `Swapper.EvictionFor` / `OnSwapStart` split).

The scheduler gathers the inputs: every model it has resident or loading, with
state and use, and the memory free for new loads (the pool's measure minus the
scheduler's own reservations for loads in progress).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runner.scheduler.models import LEAVING, ModelState


@dataclass(frozen=True, slots=True)
class Incoming:
    """The model that wants to load."""

    model: str
    mem_mb: int
    priority: int = 0


@dataclass(frozen=True, slots=True)
class Resident:
    """A model holding memory: its state, policy and use."""

    model: str
    state: ModelState
    mem_mb: int
    pinned: bool = False
    priority: int = 0
    last_used: float = 0.0
    in_flight: int = 0
    waiting: int = 0

    @property
    def busy(self) -> bool:
        return self.in_flight > 0 or self.waiting > 0


@dataclass(frozen=True, slots=True)
class Fits:
    """Enough memory is free: load now."""

    free_mb: int


@dataclass(frozen=True, slots=True)
class Evict:
    """Evict `victims` (in this order); together they free at least `short_mb`."""

    victims: tuple[str, ...]
    short_mb: int
    freed_mb: int


@dataclass(frozen=True, slots=True)
class Wait:
    """Room will come without evicting more: from models leaving or still loading."""

    reason: str


@dataclass(frozen=True, slots=True)
class Impossible:
    """Even evicting every evictable model leaves too little memory."""

    reason: str


Plan = Fits | Evict | Wait | Impossible
_EVICTABLE = (ModelState.READY, ModelState.SLEEPING)


def plan(
    target: Incoming,
    resident: Sequence[Resident],
    free_mb: int,
    evict_first: str | None = None,
) -> Plan:
    """Decide how `target` gets its memory.

    1. `evict_first` names a ready, unpinned model: it is a victim whatever else
       happens (the caller asked for it to go first, the seed's `evictModel`).
       Otherwise, if `target` fits in `free_mb`: `Fits`.
    2. Sort the others' memory: leaving (draining or stopping: on its way back),
       loading (never a victim; evictable once ready unless pinned), pinned
       (never a victim), evictable (ready or asleep, and not pinned).
    3. Even free + leaving + evictable + unpinned loading falls short: `Impossible`,
       naming need, free, evictable, pinned, loading and leaving MB.
    4. What is leaving (and `evict_first`) covers the shortfall: evict just
       `evict_first` if there is one, else `Wait` for what is leaving.
    5. A model is still loading: `Wait` for it. One swap at a time: the victims
       are chosen once its use is known, among all the models (it cannot be
       one while it loads), and the next load could not start before it anyway.
       (With nothing loading, step 3 guarantees the evictable models cover it.)
    6. Order the evictable: lower priority first, idle before busy, least
       recently used (then name, so the order is total).
    7. Take victims in that order until the shortfall is covered, then drop any
       taken earlier that the later ones made unnecessary (never `evict_first`): `Evict`.
    """
    need = target.mem_mb
    others = [r for r in resident if r.model != target.model]
    # 1
    first = next(
        (r for r in others if r.model == evict_first and r.state in _EVICTABLE and not r.pinned),
        None,
    )
    if first is None and need <= free_mb:
        return Fits(free_mb)
    # 2
    leaving = sum(r.mem_mb for r in others if r.state in LEAVING)
    loading = sum(r.mem_mb for r in others if r.state is ModelState.LOADING and not r.pinned)
    pinned = sum(r.mem_mb for r in others if r.pinned)
    evictable = [r for r in others if r.state in _EVICTABLE and not r.pinned]
    evictable_mb = sum(r.mem_mb for r in evictable)
    # 3
    if need > free_mb + leaving + evictable_mb + loading:
        return Impossible(
            f"needs {need} MB; {free_mb} MB free, {evictable_mb} MB evictable, "
            f"{pinned} MB pinned, {loading} MB loading, {leaving} MB being freed"
        )
    # 4
    taken = [first] if first is not None else []
    freed = first.mem_mb if first is not None else 0
    short = need - free_mb - leaving
    if short <= freed:
        if first is not None:
            return Evict((first.model,), max(short, 0), freed)
        return Wait(f"{leaving} MB being freed covers the {need - free_mb} MB short")
    # 5
    still_loading = [r.model for r in others if r.state is ModelState.LOADING]
    if still_loading:
        return Wait(f"{short} MB short; evicting once {', '.join(still_loading)} has loaded")
    # 6
    order = sorted(
        (r for r in evictable if r is not first),
        key=lambda r: (r.priority, r.busy, r.last_used, r.model),
    )
    # 7
    for r in order:
        if freed >= short:
            break
        taken.append(r)
        freed += r.mem_mb
    for r in reversed(taken[:-1]):
        if r is not first and freed - r.mem_mb >= short:
            taken.remove(r)
            freed -= r.mem_mb
    return Evict(tuple(r.model for r in taken), short, freed)
