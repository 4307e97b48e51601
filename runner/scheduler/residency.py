"""What the scheduler keeps about each managed model: its slot, or its wish to load.

Plain records with no decisions in them; `lifecycle.py` decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from runner.scheduler.config import ModelPolicy
from runner.scheduler.eviction import Phase, Resident


class Gate(Enum):
    """What a request for a model meets."""

    OPEN = "open"  # ready (or always ready): granted while slots are free
    QUEUE = "queue"  # loading, wanted, or swapped out and coming back: wait
    AUTOLOAD = "autoload"  # not resident, loads on demand: wait, and want it
    UNLOADING = "unloading"  # being unloaded (or evicted, without autoload): refuse
    ABSENT = "absent"  # not resident and not autoload: refuse with ModelNotLoaded


@dataclass(frozen=True, slots=True)
class Residency:
    """A managed model as the pool and capabilities see it (`Scheduler.resident`)."""

    model: str
    state: Phase
    mem_mb: int
    concurrency: int
    in_flight: int
    waiting: int
    last_used: float
    since: float  # when it entered its state
    pinned: bool
    priority: int
    evicting_for: str | None  # it is a victim of the swap to this model
    keep_alive_until: float | None
    load_s: float | None  # how long its last load took (start_load to ModelReady)


@dataclass(slots=True)
class Slot:
    """A managed model holding memory: loading, ready, draining or stopping."""

    policy: ModelPolicy
    phase: Phase
    mem_mb: int
    concurrency: int
    since: float
    last_used: float
    evict_for: str | None = None  # victim of the swap to this model
    close_at: float = 0.0  # a victim stops taking requests by then
    drain_until: float = 0.0  # draining: stopped anyway by then
    unloading: bool = False  # an unload was asked: refuse its requests
    load_s: float | None = None  # its last load, start_load to ModelReady (None: adopted)

    @classmethod
    def loading(cls, policy: ModelPolicy, now: float) -> Slot:
        return cls(policy, Phase.LOADING, policy.mem_mb, policy.concurrency, now, now)

    @property
    def leaving(self) -> bool:
        """Unloaded, evicted, or on the way there."""
        return self.unloading or self.evict_for is not None or self.phase in _OUT

    def drain(self, now: float, default_timeout_s: float) -> None:
        """Take no more requests; stop by `drain_until` whatever is still in flight."""
        timeout = self.policy.drain_timeout_s
        timeout = default_timeout_s if timeout is None else timeout
        self.phase, self.since, self.drain_until = Phase.DRAINING, now, now + timeout

    def resident(self, model: str, in_flight: int, waiting: int) -> Resident:
        """The eviction policy's view."""
        policy = self.policy
        return Resident(
            model,
            self.phase,
            self.mem_mb,
            policy.pinned,
            policy.priority,
            self.last_used,
            in_flight,
            waiting,
        )

    def view(self, model: str, in_flight: int, waiting: int) -> Residency:
        """The pool's and capabilities' view."""
        policy = self.policy
        keep = policy.keep_alive_s
        return Residency(
            model=model,
            state=self.phase,
            mem_mb=self.mem_mb,
            concurrency=self.concurrency,
            in_flight=in_flight,
            waiting=waiting,
            last_used=self.last_used,
            since=self.since,
            pinned=policy.pinned,
            priority=policy.priority,
            evicting_for=self.evict_for,
            keep_alive_until=None if keep is None or policy.pinned else self.last_used + keep,
            load_s=self.load_s,
        )


_OUT = (Phase.DRAINING, Phase.STOPPING)


@dataclass(slots=True)
class Want:
    """A model waiting for memory to load: asked for by a governed load or by autoload."""

    model: str
    policy: ModelPolicy
    evict_first: str | None
    since: float
    governed: bool  # a LoadRequested; else an autoload, dropped when nobody waits
    victims: tuple[str, ...] = ()  # chosen when its swap was committed
