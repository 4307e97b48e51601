"""What the scheduler is told at start-up."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

DEFAULT_MODEL_CONCURRENCY = 4


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Limits and policy knobs; times are seconds on the injected clock.

    - `max_queue_depth`: waiting requests (all models) before `QueueFull` (MAX_QUEUE_DEPTH).
    - `queue_timeout_s`: longest wait before `QueueTimeout` (QUEUE_TIMEOUT_MS / 1000);
      `None` waits forever.
    - `model_concurrency`: requests in flight at the engine per model (its parallel
      slots); models not listed get `default_concurrency`.
    - `tenant_weights`: share of service relative to `default_weight` (2.0 = twice).
    - `tenant_queue_caps`: waiting requests per tenant; `default_tenant_queue_cap`
      for the rest; `None` means only the global depth applies.
    - `low_aging_s`: a `low` request waiting this long is promoted to `normal`;
      `None` never promotes.
    - `fair`: VTC across tenants within a band; `False` is plain FCFS in the band
      (the benchmark's baseline).
    - `stats_window_s`: how far back wait statistics and the drain rate look.
    """

    max_queue_depth: int = 16
    queue_timeout_s: float | None = 30.0
    model_concurrency: Mapping[str, int] = field(default_factory=dict)
    default_concurrency: int = DEFAULT_MODEL_CONCURRENCY
    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    default_weight: float = 1.0
    tenant_queue_caps: Mapping[str, int] = field(default_factory=dict)
    default_tenant_queue_cap: int | None = None
    low_aging_s: float | None = 10.0
    fair: bool = True
    stats_window_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_queue_depth < 0:
            raise ValueError("max_queue_depth must be >= 0")
        if self.default_concurrency < 1 or any(c < 1 for c in self.model_concurrency.values()):
            raise ValueError("model concurrency must be >= 1")
        if self.stats_window_s <= 0:
            raise ValueError("stats_window_s must be > 0")

    def concurrency(self, model: str) -> int:
        return self.model_concurrency.get(model, self.default_concurrency)

    def tenant_queue_cap(self, tenant: str) -> int | None:
        return self.tenant_queue_caps.get(tenant, self.default_tenant_queue_cap)
