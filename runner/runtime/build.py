"""The runner's ASGI app, built from its configuration: the roof builds the whole."""

from __future__ import annotations

from governance.verifier import Verifier
from runner.engines.kinds import EngineKinds
from runner.floor.models_file import ModelsFile
from runner.floor.settings import Settings
from runner.http.app import RunnerApp
from runner.runtime.wiring import Runtime
from tenants.config import TenantsConfig


def build_app(
    settings: Settings,
    models: ModelsFile,
    tenants: TenantsConfig | None = None,
    verifier: Verifier | None = None,
    kinds: EngineKinds | None = None,
) -> RunnerApp:
    """The runner for `settings` and `models`; `kinds` the engine kinds the models file
    was checked against (default: those the settings name)."""
    return RunnerApp(Runtime(settings, models, tenants, verifier, kinds))
