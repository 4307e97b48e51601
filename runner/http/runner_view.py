"""What the app, the control plane, the status page and the tenant routes read of the
runner: the `Runtime` the roof builds (runner/runtime/wiring.py), as a protocol, so that
`http/` names no type of the room above it. mypy checks the `Runtime` against it where the
app is built (runner/runtime/build.py)."""

from __future__ import annotations

import contextlib
from typing import Protocol

from adapters.features import Features
from governance.verifier import Verifier
from runner.engines.kinds import EngineKinds
from runner.engines.pool import ModelPool
from runner.engines.specs import ModelSpecs
from runner.engines.watch import EngineWatch
from runner.errors import QuorumError
from runner.floor.models_file import ModelsFile, ModelSpec
from runner.floor.settings import Settings
from runner.http.asgi import ASGIApp, Scope
from runner.http.images.routes import ImageRoutes
from runner.jobs.manager import JobManager
from runner.lifecycle.adapter_ops import AdapterOps
from runner.lifecycle.governed import GovernedOps
from runner.lifecycle.loads import LoadManager
from runner.scheduler import SchedulerAdmission
from runner.tasks import LoadTask
from runner.telemetry.exposition import Exposition
from runner.telemetry.health import HealthReport, Life
from runner.telemetry.metrics import Metrics
from runner.telemetry.snapshot import Refresher
from runner.tenancy.build import Tenancy
from tenants.config import TenantsConfig
from tenants.identity import Identity


class Preloading(Protocol):
    """The preloads in progress (runner/runtime/startup.py `Preloads`)."""

    def retry_after_s(self) -> int: ...


class RunnerView(Protocol):
    """Everything the runner holds while it lives, as the HTTP side reads it."""

    settings: Settings
    models: ModelsFile
    tenants: TenantsConfig
    verifier: Verifier | None
    metrics: Metrics
    life: Life
    started_at: float
    identity: Identity
    tenancy: Tenancy
    kinds: EngineKinds
    refresher: Refresher
    pool: ModelPool
    admission: SchedulerAdmission
    watch: EngineWatch
    specs: ModelSpecs
    loads: LoadManager
    governed: GovernedOps
    adapter_ops: AdapterOps
    jobs: JobManager
    chat: ASGIApp
    audio: ASGIApp
    images: ImageRoutes

    @property
    def preloads(self) -> Preloading: ...

    async def start(self, stack: contextlib.AsyncExitStack) -> None:
        """Start what runs, each stop pushed on `stack`."""
        ...

    async def preload(self) -> None:
        """Attach URL engines and load the `preload` models, then turn READY."""
        ...

    def health(self) -> HealthReport: ...

    def features_of(self, spec: ModelSpec) -> Features: ...

    def api_metric_paths(self) -> dict[str, Exposition]: ...

    def loading(self) -> dict[str, LoadTask]: ...

    def unavailable(self) -> QuorumError: ...

    def identify(self, scope: Scope) -> str: ...
