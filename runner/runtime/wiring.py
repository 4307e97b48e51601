"""What the runner holds while it lives, built once: each part is given what it needs when it
is made, with three assignments afterwards: the metrics' audio usage (from tenancy, built
after the metrics), the pool's reports (`ModelPool.start`, below) and a new tenants file
(`apply_tenants`: the front-end's and the identity's configuration).

`Runtime(settings, models, ...)` builds, in order of need: tenancy (runner/tenancy/), the
engine kinds and the catalog (`ModelSpecs`), the pool and the scheduler's admission (each
other's effects and reports: the one place where two parts need each other, joined by
`ModelPool.start` when the runtime starts), the engine watch, governance, load tasks, jobs,
the snapshot refresher, the rate limiter, the front-end and the three request paths.
`start(stack)` starts what runs (timers, stores, the paths' background work) in that order,
each start's stop pushed on the stack at once, so closing the stack stops everything in the
reverse order, by construction (runner/http/app.py holds the stack across the ASGI
lifespan). Handlers read the runtime; nothing else starts or stops what it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from pathlib import Path

from adapters.features import Features
from governance.verifier import Verifier
from runner.engines.gpus import EngineHost, GpuAccounting
from runner.engines.kinds import EngineKinds
from runner.engines.pool import ModelPool
from runner.engines.sizing import model_size_mb
from runner.engines.specs import ModelSpecs
from runner.engines.watch import EngineWatch
from runner.errors import QuorumError, ServiceUnavailable
from runner.floor.models_file import ModelsFile, ModelSpec
from runner.floor.periodic import cancelled
from runner.floor.settings import Settings
from runner.http.asgi import Scope
from runner.http.frontend import FrontEnd
from runner.http.headers import tenant_of
from runner.http.images.routes import ImageRoutes, close_images, sweep_forever
from runner.jobs.build import Jobs, endpoints_of
from runner.lifecycle.adapter_ops import AdapterOps
from runner.lifecycle.catalog import Roots, available
from runner.lifecycle.governed import GovernedOps
from runner.lifecycle.loads import LoadManager
from runner.memory.factory import telemetry_from_settings
from runner.memory.leases import LeaseStore, MemoryLeaseStore, RedisLeaseStore
from runner.memory.proc import tree_resident_mb
from runner.runtime.paths import request_paths
from runner.runtime.safety import identity_from
from runner.runtime.scheduling import scheduler_config
from runner.runtime.startup import Preloads
from runner.scheduler import ModelState, SchedulerAdmission
from runner.tasks import (
    EtaEstimator,
    LoadSpeed,
    LoadTask,
    TaskStore,
)
from runner.tasks.build import task_store_for
from runner.telemetry.exposition import Exposition
from runner.telemetry.health import HealthReport, Life, health
from runner.telemetry.metrics import Metrics, SchedulerMetrics
from runner.telemetry.outcome_metrics import EngineOutcomes, OutcomeMetrics
from runner.telemetry.picker_metrics import picker_collector
from runner.telemetry.seed_metrics import export_seed_names
from runner.telemetry.snapshot import Refresher, SnapshotCollector
from runner.telemetry.state_metrics import EngineQueueCollector, ForecastGauges, HealthCollector
from runner.telemetry.traced_requests import traced_admission, traced_budgets, traced_requests
from runner.tenancy.build import Tenancy
from runner.tenancy.live import tenants_event
from tenants.config import TenantsConfig
from tenants.identity import Identity
from tenants.ratelimit import RateLimiter
from tenants.storage import storage_from_url

log = logging.getLogger("quorum.runtime")


class Runtime:
    """Everything the runner holds while it lives; built once, read by handlers."""

    def __init__(
        self,
        settings: Settings,
        models: ModelsFile,
        tenants: TenantsConfig | None = None,
        verifier: Verifier | None = None,
        kinds: EngineKinds | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        """`kinds`: the engine kinds `models` was checked against (default: those the
        settings name)."""
        s = self.settings = settings
        self.models = models
        self.tenants = tenants or TenantsConfig()
        self.verifier = verifier
        self.metrics = metrics or Metrics()
        self.life = Life.STARTING
        self.started_at = time.monotonic()
        self.outcomes = OutcomeMetrics(self.metrics.registry, self.metrics.tenant_label)
        self.kinds = kinds or EngineKinds.from_settings(s)
        self.identity: Identity = identity_from(s, self.tenants)
        self.tenancy = Tenancy.from_settings(s, self.tenants, self._in_flight_cap)
        self.metrics.declare_tenants(self.tenants.declared)
        self.metrics.audio_usage = self.tenancy.usage.audio
        self.telemetry = telemetry_from_settings(
            s.runner_memory_mb, s.cuda_visible_devices, measure=self._engines_memory_mb
        )
        self._build_engines()
        self._build_lifecycle()
        self.refresher = Refresher(
            self.pool,
            self.telemetry,
            catalog=lambda: available(list(self.specs.specs().values()), self.roots),
        )
        self._build_jobs()
        self.limiter = RateLimiter(
            self.tenants,
            storage_from_url(s.redis_url, timeout_s=s.rate_limit_store_timeout_ms / 1000),
            fail_open=s.rate_limit_fail_open,
            on_storage_error=lambda _tenant, _exc: self.metrics.ratelimit_store_errors.inc(),
        )
        self.front = self._front_end()
        self._build_paths()
        self._register_metrics()

    def _build_engines(self) -> None:
        """The catalog, the pool, the scheduler's admission and the engine watch."""
        s, kinds = self.settings, self.kinds
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
        self.pool = ModelPool(
            self.specs,
            GpuAccounting(self.telemetry, leases, s.runner_id, s.cuda_visible_devices),
            host,
            self.estimator,
            stop_grace_s=s.engine_stop_grace_s,
            drain_timeout_s=s.unload_drain_timeout_s,  # a swap's drain (`restart_engine`)
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
        self.watch = EngineWatch(
            self.pool,
            self.admission,
            s.engine_stats_interval_s,
            misses=s.engine_probe_misses,
            timeout_s=s.engine_probe_timeout_s,
            families=self.metrics.vllm,
            on_hang=self.outcomes.count_engine_hang,
        )

    def _build_lifecycle(self) -> None:
        """Governance, load tasks and the preloads."""
        s = self.settings
        ready = self.pool.ready
        self.governed = GovernedOps(
            self.verifier,
            ready.flushes,
            self.metrics,
            at_rest=lambda scope: self.kinds.flush_at_rest(scope, list(ready.values())),
        )
        self.task_store: TaskStore = task_store_for(s)
        self.roots = Roots(
            Path(s.model_base_path).expanduser(),
            Path(s.hf_home).expanduser() if s.hf_home else None,
            tuple(p.parent for m in self.models.models if (p := m.local_path()) is not None),
        )
        self.loads = LoadManager(
            self.specs,
            self.admission,
            self.governed,
            self.task_store,
            self.roots,
            self.estimator,
            s.runner_id,
            on_finished=self.metrics.count_load,
        )
        roots = self.roots
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
        self.preloads = Preloads(s.runner_id, time.time)

    def _build_jobs(self) -> None:
        """Async jobs (`Prefer: respond-async` on the image and audio routes, GET/DELETE
        /v1/jobs/{id}) and their webhooks (runner/jobs/build.py)."""
        built = Jobs.from_settings(
            self.settings, self.tenants, self.own_endpoints, self.outcomes.count_job
        )
        self.job_store, self.jobs, self.webhook_client = (
            built.store,
            built.manager,
            built.webhook_client,
        )

    def _front_end(self) -> FrontEnd:
        """The request front-end every inference path shares (runner/http/frontend.py)."""
        return FrontEnd(
            traced_admission(self.admission),
            self.limiter,
            self.tenants,
            traced_requests(self.metrics),
            multi_tenant=self.settings.enable_multi_tenant,
            path_of=self.specs.request_path,
            objectives=self.settings.objectives,
            budgets=traced_budgets(self.tenancy.budgets),
            usage=self.tenancy.usage,
            identity=self.identity,
        )

    def _build_paths(self) -> None:
        """The three request paths on the front-end (runner/runtime/paths.py)."""
        paths = request_paths(
            self.front,
            self.pool,
            self.specs,
            self.models,
            self.settings,
            self.metrics,
            self.jobs,
            job_ended=self.tenancy.usage.request,
            count_images=self.count_images,
        )
        self.chat, self.audio = paths.chat, paths.audio
        self.images: ImageRoutes = paths.images

    def _register_metrics(self) -> None:
        """The families read at scrape time, and where `/metrics` and the picker's are."""
        s, metrics = self.settings, self.metrics
        current = lambda: self.refresher.current  # noqa: E731
        metrics.registry.register(SnapshotCollector(current))
        metrics.registry.register(HealthCollector(lambda: str(self.health().body["status"])))
        metrics.registry.register(EngineQueueCollector(lambda: self.watch.loads))
        metrics.registry.register(ForecastGauges(self.admission.stats))
        metrics.watch_queue(self.admission.depth_by_priority)
        picker = picker_collector(
            self.admission, self.specs, current, self.watch, metrics.vllm, self.pool.adapters
        )
        metrics.picker_registry.register(picker)
        metrics.route(s.picker_metrics_path)
        export_seed_names(metrics, s.metrics_names, self.admission.queue_depth, current)

    async def start(self, stack: contextlib.AsyncExitStack) -> None:
        """Start what runs, in order, each stop pushed on `stack` right after its start:
        closing `stack` stops the request paths' work, the load tasks and jobs, the
        timers, the scheduler, then the engines, then the stores, in that order."""
        s = self.settings
        stack.push_async_callback(self.job_store.aclose)
        if self.webhook_client is not None:
            stack.push_async_callback(self.webhook_client.aclose)
        stack.push_async_callback(self.pool.gpus.leases.aclose)
        stack.push_async_callback(self.task_store.aclose)
        self.pool.start(self.admission)
        stack.push_async_callback(self.pool.close)
        if self.verifier is not None:
            stack.push_async_callback(self.verifier.aclose)
        stack.push_async_callback(self.limiter.aclose)
        await self.admission.start()
        stack.push_async_callback(self.admission.stop)
        await self.tenancy.start(self.apply_tenants, self.admission.permit_granted)
        stack.push_async_callback(self.tenancy.aclose)
        stack.callback(self.admission.listen(lambda _notice: self.refresher.soon()))
        await self.watch.start()
        stack.push_async_callback(self.watch.stop)
        await self.refresher.start()
        stack.push_async_callback(self.refresher.stop)
        store = self.images.store
        if store is not None:  # URLs die with the runner: so do their files
            stack.push_async_callback(close_images, store)
            sweeper = asyncio.get_running_loop().create_task(sweep_forever(store))
            stack.push_async_callback(cancelled, sweeper)
        await self.jobs.start()
        stack.push_async_callback(self.jobs.aclose)
        await self.loads.start()
        stack.push_async_callback(self.loads.aclose)
        if s.enable_metrics and s.metrics_port and s.metrics_port != s.port:
            self.metrics.serve_separately(s.metrics_port, s.host)

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

    def count_images(self, model: str, tenant: str, images: int) -> None:
        self.outcomes.count_images(model, tenant, images)
        self.tenancy.usage.images(model, tenant, images)

    def _in_flight_cap(self, tenant: str) -> int | None:
        return self.tenants.policy(tenant).max_in_flight

    def apply_tenants(self, config: TenantsConfig) -> None:
        """A new tenant configuration (runner/tenancy/live.py) applied to everything that
        reads one: identity, rate limits, the scheduler, the metrics' declared tenants."""
        self.tenants = self.front.tenants = config
        self.identity.config = config  # a rotated key works, and the old one is refused, at once
        self.limiter.reload(config)
        self.admission.tenants_changed(tenants_event(config, time.monotonic()))
        self.metrics.declare_tenants(config.declared)

    def features_of(self, spec: ModelSpec) -> Features:
        """What a loaded engine of `spec` offers its clients (its kind's)."""
        return self.specs.kind(spec).features(self.kinds.engine_spec(spec))

    def api_metric_paths(self) -> dict[str, Exposition]:
        """The metrics paths the inference port serves (`Metrics.api_paths`)."""
        return self.metrics.api_paths(self.settings.metrics_on_api_port)

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
        """Start-up's preloads (`Preloads.run`), while the runner already answers (503
        `starting`)."""
        specs = [s for s in self.specs.specs().values() if s.attached or s.preload]
        predict = lambda s: self.estimator.predict(s.backend, model_size_mb(s))  # noqa: E731
        await self.preloads.run(specs, self.loads.preload, predict)

    def _engines_memory_mb(self) -> int:
        pids = self.pool.engine_pids()
        return tree_resident_mb(pids) if pids else 0

    def own_endpoints(self) -> list[tuple[str, int]]:
        """Where this runner and its engines listen (no tenant's webhook may go there): its
        own ports, the engines' URLs (started or attached)."""
        s = self.settings
        urls = [e.url for e in list(self.pool.ready.values()) if e.url is not None]
        urls += [spec.url for spec in self.specs.specs().values() if spec.url]
        return endpoints_of([p for p in (s.port, s.metrics_port) if p], urls)

    def identify(self, scope: Scope) -> str:
        """The tenant of a control-plane request (jobs, engine logs, the status page): the
        same `Identity.identify` as inference (`headers.tenant_of`)."""
        return tenant_of(self.identity, scope, self.settings.objectives)
