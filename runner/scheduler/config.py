"""What the scheduler is told at start-up: limits, and each managed model's policy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

DEFAULT_MODEL_CONCURRENCY = 4
RESTART_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
"""A crashed `restart` model waits the n-th of these before its n-th restart in a row
(scaled by ENGINE_RESTART_BACKOFF_S, the first step)."""


@dataclass(frozen=True, slots=True)
class ModelPolicy:
    """How the scheduler treats one model the pool loads and unloads.

    - `mem_mb`: estimated footprint, reserved while it loads (the pool's measure
      replaces it at `ModelReady`).
    - `concurrency`: requests in flight at its engine (parallel slots) until
      `ModelReady` says otherwise.
    - `pinned`: never evicted, never unloaded by keep-alive.
    - `priority`: higher is more important; lower priorities are evicted first.
    - `autoload`: a request naming it while it is not resident loads it (the
      operator's own configuration); otherwise such a request gets 404
      `model_not_loaded` until a governed load.
    - `keep_alive_s`: a ready model idle this long is unloaded; `None` keeps it.
    - `restart`: after a crash it is started again (after a backoff), and its waiters
      keep waiting.
    - `drain_timeout_s`: longest wait for in-flight requests before it is
      stopped anyway; `None` takes the scheduler's `drain_timeout_s`.
    - `sleep_refusal`: why an unload may not put it to sleep (None: it may).
    - `slot_group`: the engine process it shares with other models (`comfyui:<server>`);
      models in one group share its slots (`slot_groups.py`); `None`: its own process.
    """

    mem_mb: int
    concurrency: int = 1
    pinned: bool = False
    priority: int = 0
    autoload: bool = False
    keep_alive_s: float | None = None
    restart: bool = False
    drain_timeout_s: float | None = None
    sleep_refusal: str | None = "it cannot sleep"
    slot_group: str | None = None

    def __post_init__(self) -> None:
        if self.mem_mb < 0:
            raise ValueError("mem_mb must be >= 0")
        if self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if self.keep_alive_s is not None and self.keep_alive_s < 0:
            raise ValueError("keep_alive_s must be >= 0")
        if self.drain_timeout_s is not None and self.drain_timeout_s < 0:
            raise ValueError("drain_timeout_s must be >= 0")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Limits and policy knobs; times are seconds on the injected clock.

    - `max_queue_depth`: waiting requests (all models) before `QueueFull` (MAX_QUEUE_DEPTH).
    - `queue_timeout_s`: longest wait before `QueueTimeout` (QUEUE_TIMEOUT_MS / 1000);
      `None` waits forever. A cold load counts against it: a request that made
      its model load waits in the queue meanwhile.
    - `model_concurrency`: models that are always ready (attached engines), with
      the requests each may have in flight at its engine (its parallel slots).
    - `models`: models the pool loads and unloads, with their policies (a
      `LoadRequested` adds or replaces one). A model in `model_concurrency` too
      is treated as always ready.
    - `unlisted_ready`: a model in neither map is treated as always ready with
      `default_concurrency` (the behaviour before the pool existed); `False`
      refuses requests for it with `ModelNotLoaded` until a load names it.
    - `tenant_weights`: share of service relative to `default_weight` (2.0 = twice).
    - `tenant_queue_caps`: waiting requests per tenant; `default_tenant_queue_cap`
      for the rest; `None` means only the global depth applies.
    - `tenant_in_flight_caps`: requests of a tenant at the engines at once (its
      `max_in_flight`); `default_in_flight_cap` for the rest; `None`: no cap. More wait
      in the queue, in their place. `shared_in_flight`: the caps hold across replicas,
      so a capped tenant's request also needs a permit (`PermitEffects`) to be granted.
    - `low_aging_s`: a `low` request waiting this long is promoted to `normal`;
      `None` never promotes.
    - `fair`: VTC across tenants within a band; `False` is plain FCFS in the band
      (the benchmark's baseline).
    - `stats_window_s`: how far back wait statistics look.
    - `swap_max_wait_s`: after a swap is decided, the longest a victim with
      requests still waiting keeps serving them before it stops taking more
      (llama-swap #612); within it, a victim batches for as long as its own last
      load took (see `lifecycle.py`).
    - `drain_timeout_s`: how long an unloading or evicted model's in-flight
      requests may run before it is stopped anyway (the pool cancels the rest).
    - `restart_backoff_s`: a `restart` model's engine that crashed is started again
      after these delays (the n-th crash in a row waits the n-th, the last repeats).
    - `max_restarts`: crashes in a row after which it stays failed (a crash loop);
      a model ready for `restart_window_s` starts counting again.
    - `failed_retry_after_s`: `Retry-After` of a request refused because its model
      failed and will not come back by itself.
    """

    max_queue_depth: int = 16
    queue_timeout_s: float | None = 30.0
    model_concurrency: Mapping[str, int] = field(default_factory=dict)
    default_concurrency: int = DEFAULT_MODEL_CONCURRENCY
    models: Mapping[str, ModelPolicy] = field(default_factory=dict)
    unlisted_ready: bool = True
    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    default_weight: float = 1.0
    tenant_queue_caps: Mapping[str, int] = field(default_factory=dict)
    default_tenant_queue_cap: int | None = None
    tenant_in_flight_caps: Mapping[str, int] = field(default_factory=dict)
    default_in_flight_cap: int | None = None
    shared_in_flight: bool = False
    low_aging_s: float | None = 10.0
    fair: bool = True
    stats_window_s: float = 60.0
    swap_max_wait_s: float = 30.0
    drain_timeout_s: float = 60.0
    restart_backoff_s: tuple[float, ...] = RESTART_BACKOFF_S
    max_restarts: int = 5
    restart_window_s: float = 300.0
    failed_retry_after_s: int = 30

    def __post_init__(self) -> None:
        if not self.restart_backoff_s or min(self.restart_backoff_s) < 0:
            raise ValueError("restart_backoff_s must be non-empty and >= 0")
        if self.max_queue_depth < 0:
            raise ValueError("max_queue_depth must be >= 0")
        if self.default_concurrency < 1 or any(c < 1 for c in self.model_concurrency.values()):
            raise ValueError("model concurrency must be >= 1")
        if self.stats_window_s <= 0:
            raise ValueError("stats_window_s must be > 0")
        if self.swap_max_wait_s < 0 or self.drain_timeout_s < 0:
            raise ValueError("swap_max_wait_s and drain_timeout_s must be >= 0")

    def concurrency(self, model: str) -> int:
        return self.model_concurrency.get(model, self.default_concurrency)

    def tenant_queue_cap(self, tenant: str) -> int | None:
        return self.tenant_queue_caps.get(tenant, self.default_tenant_queue_cap)

    def in_flight_cap(self, tenant: str) -> int | None:
        return self.tenant_in_flight_caps.get(tenant, self.default_in_flight_cap)
