"""What the scheduler knows of each model, and what a request for it meets (pure).

The scheduler is the one owner of a model's state: every admission and refusal is
decided here, from this record, and `/health`, capabilities, `/metrics` and load tasks
read it (`ModelView`). The pool only carries out `start_load` / `stop_models` and
reports what happened (runner/engines/pool.py).

    ABSENT ──start_load──▶ LOADING ──ModelReady──▶ READY ──drain──▶ DRAINING ──▶ STOPPING
      ▲ ▲                    │  ▲                    │                              │
      │ │                    │  └──restart (backoff)─┼──── FAILED ◀──crash──────────┤
      │ │                    └──LoadFailure──▶ ABSENT │       │                       │
      │ └──────────────────────────ModelStopped──────┼───────┴── unload ─────────────┘
      │                                              └──unload mode sleep──▶ SLEEPING
      └──────────────────────────unload / evict ◀──────────────────────────────┘

What a request for a model meets, in each state (`admission`, and `docs/api.md`):

| state                               | request                                           |
|-------------------------------------|---------------------------------------------------|
| not a model of this runner          | 404 model_not_found                               |
| ABSENT (not autoload)               | 404 model_not_loaded                              |
| ABSENT (autoload), wanted, LOADING  | waits in the queue (the load may be planned)      |
| READY                               | granted while it has free slots, else waits       |
| READY, a victim still batching      | granted/waits (served before it goes)             |
| DRAINING/STOPPING for an unload     | 503 model_unloading                               |
| DRAINING/STOPPING for an eviction   | waits if autoload or wanted back, else 503        |
|                                     | model_unloading                                   |
| FAILED, a restart due               | waits (bounded by the queue timeout)              |
| FAILED (no restart, or gave up)     | 503 model_unavailable with the reason and         |
|                                     | Retry-After (autoload: waits, the load is retried)|
| SLEEPING                            | 404 model_not_loaded (a governed load wakes it)   |
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum, StrEnum

from faults import BadRequest, QuorumError
from runner.errors import ModelNotFound
from runner.scheduler.config import ModelPolicy, SchedulerConfig
from runner.scheduler.errors import ModelFailed, ModelNotLoaded, ModelUnloading


class ModelState(StrEnum):
    """A model's state: the one the whole runner reads."""

    ABSENT = "absent"  # known, no engine (and no memory)
    LOADING = "loading"  # start_load was called; memory is reserved
    READY = "ready"  # serving
    DRAINING = "draining"  # no new requests; in-flight ones finish
    STOPPING = "stopping"  # stop_models was called; waits for ModelStopped
    SLEEPING = "sleeping"  # vLLM's warm standby: the process lives, weights off the GPU
    FAILED = "failed"  # its engine failed (reason); a restart may be due

    @property
    def holds_memory(self) -> bool:
        """Loading, ready, draining, stopping or sleeping: counted against free memory."""
        return self in _HOLDING


_HOLDING = frozenset(
    {
        ModelState.LOADING,
        ModelState.READY,
        ModelState.DRAINING,
        ModelState.STOPPING,
        ModelState.SLEEPING,
    }
)
LEAVING = (ModelState.DRAINING, ModelState.STOPPING)

ALLOWED: dict[ModelState, frozenset[ModelState]] = {
    ModelState.ABSENT: frozenset({ModelState.LOADING}),
    ModelState.LOADING: frozenset(
        {ModelState.READY, ModelState.ABSENT, ModelState.FAILED, ModelState.STOPPING}
    ),
    ModelState.READY: frozenset(
        {ModelState.DRAINING, ModelState.FAILED, ModelState.ABSENT, ModelState.LOADING}
    ),
    ModelState.DRAINING: frozenset(
        {ModelState.STOPPING, ModelState.FAILED, ModelState.ABSENT, ModelState.READY}
    ),
    ModelState.STOPPING: frozenset({ModelState.ABSENT, ModelState.SLEEPING, ModelState.FAILED}),
    ModelState.SLEEPING: frozenset(
        {ModelState.LOADING, ModelState.DRAINING, ModelState.ABSENT, ModelState.FAILED}
    ),
    ModelState.FAILED: frozenset({ModelState.LOADING, ModelState.STOPPING, ModelState.ABSENT}),
}


class IllegalModelTransition(RuntimeError):
    """A state change the table forbids (always a bug)."""


class Gate(Enum):
    """What a request for a model meets, when it is not refused."""

    OPEN = "open"  # ready: granted while slots are free
    QUEUE = "queue"  # loading, wanted, restarting, or coming back: wait
    AUTOLOAD = "autoload"  # not resident, loads on demand: wait, and want it


@dataclass(slots=True)
class ModelRecord:
    """One model the scheduler knows: its policy, state, memory and use."""

    policy: ModelPolicy
    state: ModelState = ModelState.ABSENT
    mem_mb: int = 0
    concurrency: int = 1
    since: float = 0.0  # when it entered its state
    last_used: float = 0.0
    evict_for: str | None = None  # a victim of the swap to this model
    close_at: float = 0.0  # a victim stops taking requests by then
    drain_until: float = 0.0  # draining: stopped anyway by then
    drain_s: float = 0.0  # draining: the drain timeout it was given
    unloading: bool = False  # an unload (or sleep) was asked: refuse its requests
    sleep: bool = False  # the unload asked puts it to sleep rather than stopping it
    load_s: float | None = None  # its last load, start_load to ModelReady (None: adopted)
    reason: str | None = None  # FAILED: why, in words fit for any tenant
    exit_code: int | None = None  # FAILED by an engine exit: its code (-N: signal N)
    crashes: int = 0  # crashes since it was last ready for `restart_window_s`
    restarts: int = 0  # restarts after a crash, all told
    restart_at: float | None = None  # FAILED: a restart is due then

    def move(self, model: str, to: ModelState, now: float) -> None:
        """Change state through the table (`ALLOWED`); a forbidden move is a bug."""
        if to is not self.state and to not in ALLOWED[self.state]:
            raise IllegalModelTransition(f"model {model!r}: {self.state} -> {to}")
        self.state, self.since = to, now

    @property
    def leaving(self) -> bool:
        """Unloaded, evicted, or on the way there."""
        return self.unloading or self.evict_for is not None or self.state in LEAVING

    def drain(self, model: str, now: float, default_timeout_s: float) -> None:
        """Take no more requests; stop by `drain_until` whatever is still in flight."""
        timeout = self.policy.drain_timeout_s
        self.move(model, ModelState.DRAINING, now)
        self.drain_s = default_timeout_s if timeout is None else timeout
        self.drain_until = now + self.drain_s

    def view(self, model: str, in_flight: int, waiting: int) -> ModelView:
        policy = self.policy
        keep = policy.keep_alive_s
        return ModelView(
            model=model,
            state=self.state,
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
            unloading=self.unloading,
            reason=self.reason,
            exit_code=self.exit_code,
            restart_at=self.restart_at,
            restarts=self.restarts,
        )


@dataclass(frozen=True, slots=True)
class ModelView:
    """A model as the rest of the runner reads it (`Scheduler.models`)."""

    model: str
    state: ModelState
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
    unloading: bool = False
    reason: str | None = None
    exit_code: int | None = None
    restart_at: float | None = None
    restarts: int = 0

    @property
    def serving(self) -> bool:
        """Ready or draining: it answers requests (capabilities' `loaded`)."""
        return self.state in (ModelState.READY, ModelState.DRAINING)


@dataclass(slots=True)
class Want:
    """A model waiting for memory to load: asked for by a governed load or by autoload."""

    model: str
    policy: ModelPolicy
    evict_first: str | None
    since: float
    governed: bool  # a LoadRequested; else an autoload, dropped when nobody waits
    victims: tuple[str, ...] = ()  # chosen when its swap was committed


def admission(
    model: str,
    record: ModelRecord | None,
    wanted: bool,
    known: Collection[str],
    failed_retry_after_s: int,
) -> Gate | QuorumError:
    """What a request for `model` meets now: a gate, or the refusal to answer it with.

    1. Not a model of this runner: 404 `model_not_found`, naming the models.
    2. Wanted (a load waits for memory): wait.
    3. Ready: open; a victim of a swap still serves its batch.
    4. Loading: wait.
    5. Failed: a restart due, or autoload (the load is retried): wait; otherwise 503
       `model_unavailable` with the reason and `failed_retry_after_s`.
    6. Draining or stopping: for an unload, 503 `model_unloading`; for an eviction,
       wait if it comes back (autoload), else 503 `model_unloading`.
    7. Absent or sleeping: autoload loads it (wait); otherwise 404 `model_not_loaded`.
    """
    if record is None:  # 1
        return ModelNotFound(model=model, models=", ".join(sorted(known)) or "none")
    if wanted:  # 2
        return Gate.QUEUE
    state, autoload = record.state, record.policy.autoload
    if state is ModelState.READY:  # 3
        return Gate.OPEN
    if state is ModelState.LOADING:  # 4
        return Gate.QUEUE
    if state is ModelState.FAILED:  # 5
        if record.restart_at is not None:
            return Gate.QUEUE
        if autoload:
            return Gate.AUTOLOAD
        return ModelFailed(
            model=model,
            reason=record.reason or "its engine failed",
            retry_after=failed_retry_after_s,
        )
    if state in LEAVING:  # 6
        if record.unloading or not autoload:
            return ModelUnloading(model=model, reason="it is being unloaded")
        return Gate.QUEUE
    if autoload and not record.unloading:  # 7
        return Gate.AUTOLOAD
    return ModelNotLoaded(model=model)


def cut_short(model: str, record: ModelRecord) -> QuorumError:
    """What the requests still in flight on a draining `model` are answered when its drain
    timeout passes and its engine is stopped (or put to sleep) under them: 503
    `model_unloading`, as the requests refused during the drain, saying why.

    1. Evicted to load another model (and not unloaded as well): that model is named.
    2. Unloaded with `mode: "sleep"`: put to sleep.
    3. Otherwise: unloaded.
    """
    if record.evict_for is not None and not record.unloading:  # 1
        why = f"it was evicted to load {record.evict_for!r}"
    elif record.sleep:  # 2
        why = "it was put to sleep"
    else:  # 3
        why = "it was unloaded"
    timeout = f"{record.drain_s:g} s"
    reason = f"{why}, and this request was still running when its drain timeout ({timeout}) passed"
    return ModelUnloading(model=model, reason=reason)


class ModelTable:
    """Every model the scheduler knows: its record, the wants, and the always-ready ones.

    Plain state with queries; the decisions are `admission` above and the lifecycle's.
    A model in `model_concurrency` (or any model, with `unlisted_ready`) is always ready:
    its record is made READY, pinned, the first time it is asked about.
    """

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.records: dict[str, ModelRecord] = {
            model: ModelRecord(policy, concurrency=policy.concurrency)
            for model, policy in config.models.items()
            if model not in config.model_concurrency
        }
        self.wants: dict[str, Want] = {}
        self.fixed: set[str] = set()  # always ready: never loaded, stopped or unloaded

    def get(self, model: str) -> ModelRecord | None:
        """The model's record; an always-ready model gets one the first time (READY)."""
        record = self.records.get(model)
        if record is None and self.always_ready(model):
            slots = self.config.concurrency(model)
            record = ModelRecord(ModelPolicy(0, slots, pinned=True), ModelState.READY, 0, slots)
            self.records[model] = record
            self.fixed.add(model)
        return record

    def always_ready(self, model: str) -> bool:
        if model in self.config.model_concurrency:
            return True
        return self.config.unlisted_ready and model not in self.records

    def add(self, model: str, policy: ModelPolicy) -> ModelRecord:
        """Know `model` with `policy` (a record it has keeps its state and takes the policy)."""
        record = self.records.get(model)
        if record is None:
            record = self.records[model] = ModelRecord(policy, concurrency=policy.concurrency)
        record.policy = policy
        return record

    def gate(self, model: str) -> Gate | QuorumError:
        """What a request for `model` meets now (`admission`)."""
        return admission(
            model,
            self.get(model),
            model in self.wants,
            self.records.keys(),
            self.config.failed_retry_after_s,
        )

    def status(self, model: str) -> str:
        """The model's state (`ModelState`); `queued` while it holds nothing and a load
        of it waits for memory."""
        record = self.get(model)
        if record is not None and record.state.holds_memory:
            return record.state.value
        if model in self.wants:
            return "queued"
        return record.state.value if record is not None else ModelState.ABSENT.value

    def loading(self) -> list[str]:
        return [m for m, r in self.records.items() if r.state is ModelState.LOADING]

    def wanted(self) -> dict[str, tuple[str, ...]]:
        """Models waiting for memory to load, with the victims chosen for each."""
        return {model: want.victims for model, want in self.wants.items()}

    def holding(self) -> dict[str, ModelRecord]:
        """The models holding memory (loading, ready, draining, stopping, sleeping)."""
        return {m: r for m, r in self.records.items() if r.state.holds_memory}

    def reserved_mb(self) -> int:
        """Memory reserved for loads in progress (the pool's measure does not show it yet)."""
        return sum(r.mem_mb for r in self.records.values() if r.state is ModelState.LOADING)


def unload_refusal(model: str, record: ModelRecord | None, mode: str) -> QuorumError | None:
    """Why an unload of `model` cannot run now; None when it can. Asked before governance
    spends a token on it.

    1. Not a model of this runner: 404 `model_not_found`.
    2. `sleep`: only a model that can sleep (`policy.sleep_refusal` says why not: 400),
       and only while ready.
    3. `stop`: it must hold an engine: ready, failed (what is left of it) or asleep;
       otherwise 404 `model_not_loaded`, naming its state.
    """
    if record is None:  # 1
        return ModelNotFound(f"model {model!r} does not exist on this runner", model=model)
    if mode == "sleep":  # 2
        if record.policy.sleep_refusal is not None:
            return BadRequest(record.policy.sleep_refusal)
        stoppable: tuple[ModelState, ...] = (ModelState.READY,)
    else:  # 3
        stoppable = (ModelState.READY, ModelState.FAILED, ModelState.SLEEPING)
    if record.state not in stoppable or record.unloading:
        state = "being unloaded" if record.unloading else record.state.value
        return ModelNotLoaded(f"model {model!r} is not loaded ({state})", model=model)
    return None
