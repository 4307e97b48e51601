"""What the runner holds while it lives, built once at start: settings, models, the pool,
the scheduler's admission, load tasks, governance, jobs, telemetry and the snapshot
refresher, wired to each other. Handlers read it; only start-up and shutdown
(runner/http/app.py) start and stop what it holds.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from fastapi import Request

from adapters.features import Features
from governance.verifier import Verifier
from runner.engines.gpus import EngineHost, GpuAccounting
from runner.engines.kinds import EngineKinds
from runner.engines.pool import ModelPool
from runner.engines.sizing import model_size_mb
from runner.engines.specs import ModelSpecs
from runner.engines.watch import EngineWatch
from runner.errors import QuorumError, ServiceUnavailable
from runner.http.frontend import FrontEnd
from runner.http.headers import parse_request_headers
from runner.jobs import JobManager, JobStore, MemoryJobStore, RedisJobStore, WebhookSender
from runner.lifecycle.catalog import Roots, available
from runner.lifecycle.governed import GovernedOps
from runner.lifecycle.loads import LoadManager
from runner.memory.factory import telemetry_from_settings
from runner.memory.leases import LeaseStore, MemoryLeaseStore, RedisLeaseStore
from runner.memory.proc import tree_resident_mb
from runner.runtime.models_file import ModelsFile, ModelSpec
from runner.runtime.settings import Settings
from runner.runtime.startup import Preloads
from runner.scheduler import ModelState, SchedulerAdmission, SchedulerConfig
from runner.scheduler.config import RESTART_BACKOFF_S
from runner.tasks import (
    EtaEstimator,
    LoadSpeed,
    LoadTask,
    MemoryTaskStore,
    RedisTaskStore,
    TaskStore,
)
from runner.telemetry.health import HealthReport, Life, health
from runner.telemetry.metrics import Metrics, SchedulerMetrics
from runner.telemetry.outcome_metrics import OutcomeMetrics
from runner.telemetry.picker_metrics import picker_collector
from runner.telemetry.seed_metrics import export_seed_names
from runner.telemetry.snapshot import Refresher, SnapshotCollector
from runner.telemetry.state_metrics import EngineQueueCollector, HealthCollector
from runner.tenancy.build import Tenancy
from runner.tenancy.live import tenants_event
from tenants.config import TenantsConfig
from tenants.identity import DEFAULT_TENANT, resolve_tenant
from tenants.ratelimit import RateLimiter

log = logging.getLogger("quorum.runtime")


def scheduler_config(
    settings: Settings, specs: ModelSpecs, tenants: TenantsConfig
) -> SchedulerConfig:
    """The scheduler's limits from settings, the pool's models and the tenants' policies.

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


class EngineOutcomes:
    """What the pool tells metrics (`pool.PoolObserver`): loads, restarts, crashes."""

    def __init__(self, metrics: Metrics, outcomes: OutcomeMetrics, kinds: EngineKinds) -> None:
        self.metrics = metrics
        self.outcomes = outcomes
        self.kinds = kinds

    def loaded(self, spec: ModelSpec, seconds: float) -> None:
        self.metrics.observe_load(spec.backend, seconds)

    def restarted(self, spec: ModelSpec) -> None:
        self.outcomes.count_engine_restart(spec.id, spec.backend)
        if self.kinds.of(spec).traits.request_path == "audio":  # a speech worker
            self.metrics.count_worker_restart(spec.id)

    def crashed(self, spec: ModelSpec) -> None:
        self.outcomes.count_engine_crash(spec.id, spec.backend)


@dataclass
class Runtime:
    """Everything the runner holds while it lives; built once, read by handlers."""

    settings: Settings
    models: ModelsFile
    tenants: TenantsConfig = field(default_factory=TenantsConfig)
    metrics: Metrics = field(default_factory=Metrics)
    kinds: EngineKinds | None = None
    specs: ModelSpecs = field(init=False)
    pool: ModelPool = field(init=False)
    loads: LoadManager = field(init=False)
    front: FrontEnd = field(init=False)
    refresher: Refresher = field(init=False)
    preloads: Preloads = field(init=False)
    outcomes: OutcomeMetrics = field(init=False)
    roots: Roots = field(init=False)
    life: Life = Life.STARTING
    started_at: float = field(default_factory=time.monotonic)
    verifier: Verifier | None = None
    admission: SchedulerAdmission = field(init=False)
    limiter: RateLimiter | None = None
    governed: GovernedOps = field(init=False)
    watch: EngineWatch = field(init=False)
    webhook_client: httpx.AsyncClient | None = None
    tenancy: Tenancy = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        kinds = self.kinds = self.kinds or EngineKinds.from_settings(s)
        self.tenancy = Tenancy.from_settings(s, self.tenants, self._in_flight_cap)
        self.metrics.declare_tenants(self.tenants.declared)
        self.metrics.audio_usage = self.tenancy.usage.audio
        self.telemetry = telemetry_from_settings(
            s.runner_memory_mb, s.cuda_visible_devices, measure=self._engines_memory_mb
        )
        leases: LeaseStore = (
            RedisLeaseStore.from_url(
                s.redis_url, prefix=f"quorum:mem:lease:{socket.gethostname()}:"
            )
            if s.redis_url
            else MemoryLeaseStore(time.monotonic)
        )
        host = EngineHost(self.telemetry, self.metrics.vllm)
        self.specs = ModelSpecs(self.models.models, kinds, host.gpu_total_mb)
        # Load time by backend and size (the tasks' eta); until a first load is measured,
        # each kind's guess.
        self.estimator = EtaEstimator(
            defaults={
                k.name: LoadSpeed(g.start_s, g.bandwidth_mb_s)
                for k in kinds
                if (g := k.traits.load_guess) is not None
            }
        )
        self.outcomes = OutcomeMetrics(self.metrics.registry, self.metrics.tenant_label)
        self.pool = ModelPool(
            self.specs,
            GpuAccounting(self.telemetry, leases, s),
            host,
            self.estimator,
            stop_grace_s=s.engine_stop_grace_s,
            observer=EngineOutcomes(self.metrics, self.outcomes, kinds),
            clock=time.time,  # `loadedAt`
            monotonic=time.monotonic,  # load and wake times
        )
        self.admission = SchedulerAdmission(
            scheduler_config(s, self.specs, self.tenants),
            observer=SchedulerMetrics(self.metrics),
            models=self.pool,
            permits=self.tenancy.permits,
        )
        self.pool.start(self.admission)
        self.watch = EngineWatch(
            self.pool,
            self.admission,
            s.engine_stats_interval_s,
            misses=s.engine_probe_misses,
            timeout_s=s.engine_probe_timeout_s,
            families=self.metrics.vllm,
            on_hang=self.outcomes.count_engine_hang,
        )
        self.governed = GovernedOps(self.verifier, self.pool.ready.flushes, self.metrics)
        store: TaskStore = (
            RedisTaskStore.from_url(s.redis_url) if s.redis_url else MemoryTaskStore(time.time)
        )
        roots = Roots(
            Path(s.model_base_path).expanduser(),
            Path(s.hf_home).expanduser() if s.hf_home else None,
            tuple(p.parent for m in self.models.models if (p := m.local_path()) is not None),
        )
        self.roots = roots
        self.loads = LoadManager(
            self.specs,
            self.admission,
            self.governed,
            store,
            roots,
            self.estimator,
            s.runner_id,
            on_finished=self.metrics.count_load,
        )
        self.preloads = Preloads(s.runner_id, time.time)
        self.refresher = Refresher(
            self.pool,
            self.telemetry,
            catalog=lambda: available(list(self.specs.specs().values()), roots),
        )
        self.admission.listen(lambda _notice: self.refresher.soon())  # a model changed state
        self.metrics.registry.register(SnapshotCollector(lambda: self.refresher.current))
        self.metrics.registry.register(HealthCollector(lambda: str(self.health().body["status"])))
        self.metrics.registry.register(EngineQueueCollector(lambda: self.watch.loads))
        rt = self  # the endpoint picker's `vllm:*` gauges (runner/telemetry/picker_metrics.py)
        picker = picker_collector(
            rt.admission, rt.specs, lambda: rt.refresher.current, rt.watch, rt.metrics.vllm
        )
        self.metrics.picker_registry.register(picker)
        self.metrics.route(s.picker_metrics_path)
        export_seed_names(
            rt.metrics, s.metrics_names, rt.admission.queue_depth, lambda: rt.refresher.current
        )
        self._jobs_init()

    def health(self) -> HealthReport:
        """The runner's health, derived once from the scheduler's models
        (`runner/telemetry/health.py`): what `/health` (the readiness probe), capabilities'
        `health` and `/metrics`' `quorum_health` all say."""
        views = self.admission.models().values()
        snap = self.refresher.current
        return health(
            self.life,
            time.monotonic() - self.started_at,
            sum(1 for v in views if v.state is ModelState.READY),
            sum(1 for v in views if v.state is ModelState.FAILED),
            self.admission.queue_depth(),
            self.settings.max_queue_depth,
            gpu_out_of_memory=snap.source == "nvml" and snap.out_of_memory(),
        )

    def front_end(self, limiter: RateLimiter) -> FrontEnd:
        """The request front-end every inference path shares (runner/http/frontend.py)."""
        specs = self.specs

        def path_of(model: str) -> str | None:
            spec = specs.spec(model)
            return specs.kind(spec).traits.request_path if spec is not None else None

        return FrontEnd(
            self.admission,
            limiter,
            self.tenants,
            self.metrics,
            multi_tenant=self.settings.enable_multi_tenant,
            models=self.admission,
            path_of=path_of,
            objectives=self.settings.objectives,
            budgets=self.tenancy.budgets,
            usage=self.tenancy.usage,
        )

    def count_images(self, model: str, tenant: str, images: int) -> None:
        self.outcomes.count_images(model, tenant, images)
        self.tenancy.usage.images(model, tenant, images)

    def _in_flight_cap(self, tenant: str) -> int | None:
        return self.tenants.policy(tenant).max_in_flight

    def apply_tenants(self, config: TenantsConfig) -> None:
        """A new tenant configuration (runner/tenancy/live.py) applied to everything that
        reads one: identity, rate limits, the scheduler, the metrics' declared tenants."""
        self.tenants = config
        if hasattr(self, "front"):
            self.front.tenants = config
        if self.limiter is not None:
            self.limiter.reload(config)
        self.admission.tenants_changed(tenants_event(config, time.monotonic()))
        self.metrics.declare_tenants(config.declared)

    def features_of(self, spec: ModelSpec) -> Features:
        """What a loaded engine of `spec` offers its clients (its kind's)."""
        return self.specs.kind(spec).features(self.specs.kinds.engine_spec(spec))

    def loading(self) -> dict[str, LoadTask]:
        """Each loading model's progress: start-up's preload, governed load tasks."""
        return {**self.preloads.loading(), **self.loads.progress()}

    def unavailable(self) -> QuorumError:
        """What a request the runner cannot serve in its life state gets: 503, and while it
        starts a `Retry-After` of the preloads' time left (runner/runtime/startup.py)."""
        error = ServiceUnavailable(f"runner is {self.life.value}; retry on another runner")
        if self.life is Life.STARTING:
            error.headers["Retry-After"] = str(self.preloads.retry_after_s())
        return error

    async def preload(self) -> None:
        """Attach URL engines and load `preload` models, one after another, through the
        scheduler's memory policy; a failure is recorded (the model reads failed), not
        fatal. Runs while the runner already answers (503 `starting`): `preloads` says how
        far it is."""
        specs = [s for s in self.specs.specs().values() if s.attached or s.preload]
        for spec in specs:  # attaching an engine somebody else runs is one probe: ~0 s
            size = model_size_mb(spec)
            predicted = 0.0 if spec.attached else self.estimator.predict(spec.backend, size)
            self.preloads.plan(spec.id, predicted)
        for spec in specs:
            self.preloads.begin(spec.id)
            try:
                notice = await self.loads.preload(spec)
            finally:
                self.preloads.end()
            if notice.refused is not None or notice.view.state is not ModelState.READY:
                why = notice.refused or notice.view.reason
                log.error("preload of %s failed: %s", spec.id, why)

    def _engines_memory_mb(self) -> int:
        pids = self.pool.engine_pids()
        return tree_resident_mb(pids) if pids else 0

    # -- async jobs: `Prefer: respond-async` on the image and audio routes,
    # GET/DELETE /v1/jobs/{id}; webhooks signed with WEBHOOK_SECRET when it is set.

    def _jobs_init(self) -> None:
        s = self.settings
        self.job_store: JobStore = (
            RedisJobStore.from_url(s.redis_url, retention_s=s.job_retention_s)
            if s.redis_url
            else MemoryJobStore(time.time, retention_s=s.job_retention_s)
        )
        sender = None
        if s.webhook_secret is not None:  # validated at start-up (quorum serve: exit 2)
            self.webhook_client = httpx.AsyncClient(follow_redirects=False)
            sender = WebhookSender(self.webhook_client, s.webhook_secret.get_secret_value())
        self.jobs = JobManager(self.job_store, sender, s.runner_id, time.time)
        self.jobs.on_finished = self.outcomes.count_job

    def request_tenant(self, request: Request) -> str:
        """The tenant of a control-plane request (jobs, logs), identified as for inference."""
        meta = parse_request_headers(list(request.scope["headers"]))
        if not self.settings.enable_multi_tenant:
            return DEFAULT_TENANT
        return resolve_tenant(
            meta.authorization, meta.tenant_header, self.tenants, meta.fairness_id
        )
