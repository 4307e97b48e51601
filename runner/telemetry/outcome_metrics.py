"""Counters of how things ended: engine crashes and restarts, async jobs, images.

    quorum_engine_crashes_total{model, backend}   an engine that died while serving, unasked
                                                  (a crash; an engine that fails while it
                                                  starts is a failed load instead)
    quorum_engine_hangs_total{model, backend}     of those crashes, engines the runner
                                                  killed because they stopped answering
                                                  their probe (runner/engines/watch.py)
    quorum_engine_restarts_total{model, backend}  an engine started again after a crash
                                                  (`restart: true`)
    quorum_jobs_total{kind, outcome}              async jobs that ended: succeeded, failed,
                                                  cancelled (kinds: image_generation,
                                                  transcription, translation)
    quorum_images_total{model, tenant}            images generated and answered (sync or job)

The runner's other counters are in runner/telemetry/metrics.py; these share its registry and its
tenant label cap. `EngineOutcomes` is what the pool tells them (and the load times, the
speech workers' restarts in metrics.py).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter

from runner.engines.kinds import EngineKinds
from runner.floor.models_file import ModelSpec
from runner.telemetry.metrics import Metrics


class OutcomeMetrics:
    def __init__(self, registry: CollectorRegistry, tenant_label: Callable[[str], str]) -> None:
        self.tenant_label = tenant_label
        self.crashes = Counter(
            "quorum_engine_crashes_total",
            "Engines that died while serving, unasked, by model and engine kind",
            ["model", "backend"],
            registry=registry,
        )
        self.hangs = Counter(
            "quorum_engine_hangs_total",
            "Engines the runner killed because they stopped answering their probe (each "
            "also counted a crash), by model and engine kind",
            ["model", "backend"],
            registry=registry,
        )
        self.restarts = Counter(
            "quorum_engine_restarts_total",
            "Engines started again after a crash, by model and engine kind",
            ["model", "backend"],
            registry=registry,
        )
        self.jobs = Counter(
            "quorum_jobs_total",
            "Async jobs that ended, by kind and outcome (succeeded, failed, cancelled)",
            ["kind", "outcome"],
            registry=registry,
        )
        self.images = Counter(
            "quorum_images_total",
            "Images generated and answered, by model and tenant",
            ["model", "tenant"],
            registry=registry,
        )

    def count_engine_crash(self, model: str, backend: str) -> None:
        self.crashes.labels(model, backend).inc()

    def count_engine_hang(self, model: str, backend: str) -> None:
        self.hangs.labels(model, backend).inc()

    def count_engine_restart(self, model: str, backend: str) -> None:
        self.restarts.labels(model, backend).inc()

    def count_job(self, kind: str, outcome: str) -> None:
        self.jobs.labels(kind, outcome).inc()

    def count_images(self, model: str, tenant: str, images: int) -> None:
        if images > 0:
            self.images.labels(model, self.tenant_label(tenant)).inc(images)


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
