"""The `quorum` command: `quorum serve` starts the runner; other groups add tools: the
signers' `token` and `registry` (governance/cli.py), the operators' `status`, `load`,
`unload`, `flush`, `cancel`, `tasks` and `logs` (client/cli/, over HTTP)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from client.cli import add_commands as add_operator_commands
from governance.cli import add_commands

if TYPE_CHECKING:
    from runner.floor.settings import Settings
    from runner.http.app import RunnerApp


def app_from_environment(
    port: int | None = None, uvicorn_version: str | None = None
) -> tuple[Settings, RunnerApp] | str:
    """The runner's settings and app as `quorum serve` builds them from the environment
    (and `port`, when given); the reason as text when the configuration is invalid or the
    uvicorn installed (`uvicorn_version` when given) is one the HTTP seam was not tested
    with (runner/http/uvicorn_seam.py)."""
    from governance.errors import ConfigInvalid
    from runner.engines.kinds import EngineKinds
    from runner.errors import ConfigError
    from runner.floor.models_file import default_models_path, load_models_file
    from runner.floor.settings import load_settings
    from runner.jobs.webhooks import load_secret
    from runner.lifecycle.gate import governance_from
    from runner.runtime.build import build_app
    from runner.runtime.logs import configure
    from runner.runtime.safety import check_configuration
    from runner.telemetry import tracing
    from tenants.config import build_config
    from tenants.errors import InvalidTenantConfig

    try:
        from runner.http.uvicorn_seam import check_uvicorn

        check_uvicorn(uvicorn_version)
        settings = load_settings()
        if port is not None:
            settings = settings.model_copy(update={"port": port})
        kinds = EngineKinds.from_settings(settings)
        models = load_models_file(settings.models_config or default_models_path(), kinds)
        tenants = build_config(os.environ, settings.tenants_file)
        if settings.webhook_secret is not None:
            load_secret(settings.webhook_secret.get_secret_value(), "WEBHOOK_SECRET")
        check_configuration(settings, tenants)
        verifier = governance_from(settings)
        tracing.configure()  # before the runtime is built: it asks `tracing.on()`
    except (ConfigError, InvalidTenantConfig, ConfigInvalid) as exc:
        return str(exc)
    configure(settings.log_level, settings.log_format)
    try:  # what the app takes at build (IMAGES_DIR's folder) may be refused too
        return settings, build_app(settings, models, tenants, verifier, kinds)
    except ConfigError as exc:
        return str(exc)


def _serve(args: argparse.Namespace) -> int:
    from runner.http.server import client_limits, serve

    built = app_from_environment(args.port)
    if isinstance(built, str):
        print(f"quorum: {built}", file=sys.stderr)
        return 2
    settings, app = built
    ok = serve(
        app, settings.host, settings.port, settings.shutdown_grace_s, client_limits(settings)
    )
    return 0 if ok else 3


def _tenant_keygen(args: argparse.Namespace) -> int:
    """A new API key (43 random characters) and the digest to list in the tenants file."""
    import hashlib
    import secrets

    key = secrets.token_urlsafe(32)
    digest = hashlib.sha256(key.encode()).hexdigest()
    print(f"key:    {key}")
    print(f'tenants file: api_keys: ["sha256:{digest}"]')
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="quorum", description="Quorum model runner")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="start the runner (configuration from the environment)")
    s.add_argument("--port", type=int, default=None, help="override PORT")
    s.set_defaults(func=_serve)
    t = sub.add_parser("tenants", help="tenant tools")
    tsub = t.add_subparsers(dest="tenants_command", required=True)
    k = tsub.add_parser("keygen", help="a new API key and its digest for the tenants file")
    k.set_defaults(func=_tenant_keygen)
    add_commands(sub)
    add_operator_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
