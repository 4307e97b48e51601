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
from urllib.parse import urlsplit

import httpx

from governance.verifier import Verifier
from runner.engines.attached_watch import AttachedWatch
from runner.engines.engine_watch import EngineWatch
from runner.engines.hang_watch import HangWatch
from runner.engines.pool import ModelPool
from runner.engines.sizing import model_size_mb
from runner.errors import QuorumError, ServiceUnavailable
from runner.http.asgi import Scope
from runner.http.frontend import FrontEnd, path_kind
from runner.http.headers import parse_request_headers
from runner.jobs import JobManager, JobStore, MemoryJobStore, RedisJobStore, WebhookSender
from runner.jobs.outbound import AllowList, OutboundPolicy
from runner.lifecycle.adapter_ops import AdapterOps
from runner.lifecycle.catalog import Roots, available
from runner.lifecycle.governed import GovernedOps
from runner.lifecycle.loads import LoadManager
from runner.memory.factory import telemetry_from_settings
from runner.memory.leases import LeaseStore, MemoryLeaseStore, RedisLeaseStore
from runner.memory.proc import tree_resident_mb
from runner.runtime.models_file import ModelsFile, ModelSpec
from runner.runtime.safety import identity_from
from runner.runtime.settings import Settings
from runner.runtime.startup import Preloads
from runner.scheduler import ModelState, SchedulerAdmission, SchedulerConfig
from runner.scheduler.config import RESTART_BACKOFF_S
from runner.tasks import LoadTask, MemoryTaskStore, RedisTaskStore, TaskStore
from runner.telemetry.exposition import Exposition
from runner.telemetry.health import HealthReport, Life, health
from runner.telemetry.metrics import METRICS_PATH, Metrics, SchedulerMetrics
from runner.telemetry.outcome_metrics import OutcomeMetrics
from runner.telemetry.picker_metrics import picker_collector
from runner.telemetry.seed_metrics import export_seed_names
from runner.telemetry.snapshot import Refresher, SnapshotCollector
from runner.telemetry.state_metrics import EngineQueueCollector, HealthCollector
from runner.tenancy.build import Tenancy
from runner.tenancy.live import tenants_event
from tenants.config import TenantsConfig
from tenants.identity import Identity
from tenants.ratelimit import RateLimiter

log = logging.getLogger("quorum.runtime")


def scheduler_config(
    settings: Settings, pool: ModelPool, tenants: TenantsConfig
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
        models={m: pool.policy(spec) for m, spec in pool.specs().items()},
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


@dataclass
class Runtime:
    """Everything the runner holds while it lives; built once, read by handlers."""

    settings: Settings
    models: ModelsFile
    tenants: TenantsConfig = field(default_factory=TenantsConfig)
    metrics: Metrics = field(default_factory=Metrics)
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
    adapter_ops: AdapterOps = field(init=False)
    watch: EngineWatch = field(init=False)
    attached: AttachedWatch = field(init=False)
    hangs: HangWatch = field(init=False)
    webhook_client: httpx.AsyncClient | None = None
    tenancy: Tenancy = field(init=False)
    identity: Identity = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        self.identity = identity_from(s, self.tenants)
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
        self.pool = ModelPool(
            s,
            self.models,
            self.telemetry,
            multi_tenant=s.enable_multi_tenant,
            clock=time.time,  # `loadedAt`
            monotonic=time.monotonic,  # load and wake times, the leases' expiry
            leases=leases,
            vllm_metrics=self.metrics.vllm,
        )
        self.outcomes = OutcomeMetrics(self.metrics.registry, self.metrics.tenant_label)
        self.pool.on_restart = self._restarted
        self.pool.on_crash = lambda spec: self.outcomes.count_engine_crash(spec.id, spec.backend)
        self.watch = EngineWatch(self.pool.engines, s.engine_stats_interval_s, self.metrics.vllm)
        self.admission = SchedulerAdmission(
            scheduler_config(s, self.pool, self.tenants),
            observer=SchedulerMetrics(self.metrics),
            models=self.pool,
            permits=self.tenancy.permits,
        )
        self.pool.attach(self.admission)
        self.attached = AttachedWatch(
            self.pool, self.admission, s.engine_stats_interval_s,
            failures=s.engine_probe_misses, timeout_s=s.engine_probe_timeout_s,
        )  # fmt: skip
        self.hangs = HangWatch(
            self.pool.records, self.admission, s.engine_stats_interval_s,
            misses=s.engine_probe_misses, timeout_s=s.engine_probe_timeout_s,
        )  # fmt: skip
        self.hangs.on_hang = self.outcomes.count_engine_hang
        self.governed = GovernedOps(
            self.verifier, self.pool.engines, self.metrics, at_rest=self.pool.flush_at_rest
        )
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
            self.pool,
            self.admission,
            self.governed,
            store,
            roots,
            self.models.default_backend,
            s.runner_id,
        )
        self.loads.on_finished = self.metrics.count_load
        self.adapter_ops = AdapterOps(
            self.pool,
            self.admission,
            self.governed,
            Roots(
                roots.model_base,
                roots.hf_home,
                roots.configured + tuple(Path(a.adapter.path).parent for a in self.pool.adapters),
            ),
            drain_timeout_s=s.unload_drain_timeout_s,
        )
        self.pool.on_loaded = self.metrics.observe_load
        self.preloads = Preloads(s.runner_id, time.time)
        self.refresher = Refresher(
            self.pool,
            self.telemetry,
            catalog=lambda: available(list(self.pool.specs().values()), roots),
        )
        self.admission.listen(lambda _notice: self.refresher.soon())  # a model changed state
        self.metrics.registry.register(SnapshotCollector(lambda: self.refresher.current))
        self.metrics.registry.register(HealthCollector(lambda: str(self.health().body["status"])))
        self.metrics.registry.register(EngineQueueCollector(lambda: self.watch.loads))
        rt = self  # the endpoint picker's `vllm:*` gauges (runner/telemetry/picker_metrics.py)
        picker = picker_collector(
            rt.admission, rt.pool, lambda: rt.refresher.current, rt.watch, rt.metrics.vllm
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
        specs = self.pool.specs

        def path_of(model: str) -> str | None:
            spec = specs().get(model)
            return path_kind(spec.backend) if spec is not None else None

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
            identity=self.identity,
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
        self.identity.config = config  # a rotated key works, and the old one is refused, at once
        if hasattr(self, "front"):
            self.front.tenants = config
        if self.limiter is not None:
            self.limiter.reload(config)
        self.admission.tenants_changed(tenants_event(config, time.monotonic()))
        self.metrics.declare_tenants(config.declared)

    def api_metric_paths(self) -> dict[str, Exposition]:
        """The metrics paths the inference port serves: all of them, or, with
        METRICS_ON_API_PORT=false (production), not `/metrics`, whose series name tenants
        (it stays on METRICS_PORT); the picker's aggregate path stays where it reads it."""
        paths = self.metrics.paths
        if self.settings.metrics_on_api_port:
            return paths
        return {path: e for path, e in paths.items() if path != METRICS_PATH}

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
        specs = [s for s in self.pool.specs().values() if s.attached or s.preload]
        for spec in specs:  # attaching an engine somebody else runs is one probe: ~0 s
            size = model_size_mb(spec)
            predicted = 0.0 if spec.attached else self.pool.estimator.predict(spec.backend, size)
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

    def _restarted(self, spec: ModelSpec) -> None:
        self.outcomes.count_engine_restart(spec.id, spec.backend)
        if spec.backend == "faster-whisper":
            self.metrics.count_worker_restart(spec.id)

    def _engines_memory_mb(self) -> int:
        pids = self.pool.engine_pids()
        return tree_resident_mb(pids) if pids else 0

    # -- async jobs: `Prefer: respond-async` on the image and audio routes,
    # GET/DELETE /v1/jobs/{id}; webhooks signed with the tenant's own secret or the shared
    # WEBHOOK_SECRET, sent only where the outbound policy allows (runner/jobs/outbound.py).

    def _jobs_init(self) -> None:
        s = self.settings
        self.job_store: JobStore = (
            RedisJobStore.from_url(s.redis_url, retention_s=s.job_retention_s)
            if s.redis_url
            else MemoryJobStore(time.time, retention_s=s.job_retention_s)
        )
        sender = None
        shared = s.webhook_secret.get_secret_value() if s.webhook_secret is not None else None
        if shared is not None or self.tenants.webhook_secrets:  # checked at start-up
            self.webhook_client = httpx.AsyncClient(follow_redirects=False, trust_env=False)
            policy = OutboundPolicy(
                allow=AllowList.parse(s.webhook_allow_hosts), own_endpoints=self.own_endpoints
            )
            sender = WebhookSender(
                self.webhook_client,
                shared,
                secrets=self.tenants.webhook_secrets,
                policy=policy,
                timeout_s=s.webhook_timeout_s,
            )
        self.jobs = JobManager(
            self.job_store, sender, s.runner_id, time.time, max_per_tenant=s.jobs_max_per_tenant
        )
        self.jobs.on_finished = self.outcomes.count_job

    def own_endpoints(self) -> list[tuple[str, int]]:
        """Where this runner and its engines listen (no tenant's webhook may go there): the
        engines' URLs (started or attached), its own ports on every local address."""
        found = [("127.0.0.1", self.settings.port)]
        if self.settings.metrics_port:
            found.append(("127.0.0.1", self.settings.metrics_port))
        urls = [e.base_url for e in list(self.pool.engines.values())]
        urls += [spec.url for spec in self.pool.specs().values() if spec.url]
        for url in urls:
            parts = urlsplit(url)
            if parts.scheme in ("http", "https") and parts.hostname:
                try:
                    port = parts.port or (443 if parts.scheme == "https" else 80)
                except ValueError:
                    continue
                found.append((parts.hostname, port))
        return found

    def identify(self, scope: Scope) -> str:
        """The tenant of a control-plane request (jobs, engine logs, the status page): the
        same `Identity.identify` as inference (tenants/identity.py)."""
        meta = parse_request_headers(list(scope["headers"]), self.settings.objectives)
        return self.identity.identify(
            meta.authorization,
            meta.tenant_header,
            meta.fairness_id,
            meta.gateway_secret,
            scope.get("client"),
        )
