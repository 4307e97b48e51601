"""The scheduler's configuration, from the settings, the catalog's models and the tenants'
policies: what the scheduler is built with (runner/runtime/wiring.py)."""

from __future__ import annotations

from runner.engines.specs import ModelSpecs
from runner.floor.settings import Settings
from runner.scheduler import SchedulerConfig
from runner.scheduler.config import RESTART_BACKOFF_S
from tenants.config import TenantsConfig


def scheduler_config(
    settings: Settings, specs: ModelSpecs, tenants: TenantsConfig
) -> SchedulerConfig:
    """The scheduler's limits from settings, the catalog's models and the tenants' policies.

    Every model is managed (loaded, stopped, evicted by the scheduler's policy); an engine
    attached by URL is pinned with no memory of ours, and reported ready once attached.
    """
    policies = dict(tenants.tenants)
    caps = {t: p.max_in_flight for t, p in policies.items() if p.max_in_flight}
    return SchedulerConfig(
        max_queue_depth=settings.max_queue_depth,
        queue_timeout_s=settings.queue_timeout_ms / 1000,
        models={m: specs.policy(spec) for m, spec in specs.specs().items()},
        unlisted_ready=False,
        drain_timeout_s=settings.unload_drain_timeout_s,
        restart_backoff_s=tuple(
            settings.engine_restart_backoff_s * step for step in RESTART_BACKOFF_S
        ),
        tenant_weights={t: p.weight for t, p in policies.items()},
        default_weight=tenants.default.weight,
        tenant_queue_caps={t: p.max_queued for t, p in policies.items() if p.max_queued},
        default_tenant_queue_cap=tenants.default.max_queued,
        tenant_in_flight_caps=caps,
        default_in_flight_cap=tenants.default.max_in_flight,
        shared_in_flight=settings.redis_url is not None,
        low_aging_s=settings.queue_low_aging_ms / 1000 or None,
    )
