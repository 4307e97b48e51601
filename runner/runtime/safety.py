"""Configurations the runner refuses to start with, and the identity it starts with.

Each check names the settings at fault; `quorum serve` exits 2 with all of them
(runner/runtime/cli.py). docs/security.md says why each one is unsafe.
"""

from __future__ import annotations

import logging
import time

from runner.errors import ConfigError
from runner.floor.settings import Settings
from runner.jobs.webhooks import load_secret
from tenants.config import TenantsConfig
from tenants.identity import (
    AuthLimits,
    Identity,
    IdentityMode,
    default_mode,
    parse_peers,
    startup_problems,
)
from tenants.rates import parse_rate

log = logging.getLogger("quorum.runtime")


def identity_mode(settings: Settings, tenants: TenantsConfig) -> IdentityMode:
    """TENANT_IDENTITY, else the tenants file's default (keys when it holds a key)."""
    if settings.tenant_identity is not None:
        return IdentityMode(settings.tenant_identity)
    return default_mode(tenants)


def identity_from(settings: Settings, tenants: TenantsConfig) -> Identity:
    """The one `Identity` every path of the runner asks (tenants/identity.py)."""
    mode = identity_mode(settings, tenants)
    if mode is IdentityMode.KEYS and not tenants.has_api_keys and settings.enable_multi_tenant:
        log.warning(
            "TENANT_IDENTITY=keys and no API key in the tenants file: every inference "
            "request is refused (401) until keys are added"
        )
    secret = settings.gateway_secret
    return Identity(
        tenants,
        mode,
        multi_tenant=settings.enable_multi_tenant,
        gateway_peers=parse_peers(settings.gateway_peers),
        gateway_secret=secret.get_secret_value() if secret is not None else None,
        limits=AuthLimits(
            parse_rate(settings.auth_failure_source_limit),
            parse_rate(settings.auth_failure_tenant_limit),
        ),
        clock=time.monotonic,
    )


def check_configuration(settings: Settings, tenants: TenantsConfig) -> None:
    """Refuse (ConfigError naming every problem) what would open a way around the gate.

    1. Identity: ADMIN_TENANTS in open mode; ENABLE_MULTI_TENANT=false beside keys
       (tenants/identity.py `startup_problems`); gateway settings outside gateway mode;
       gateway mode with neither GATEWAY_PEERS nor GATEWAY_SECRET (anyone reaching the
       port would name its own tenant, the admin's included).
    2. Legacy HMAC tokens without a shared nonce store: a seed-form token names no
       runner (`aud` is optional there), and each replica would accept it once.
    3. METRICS_ON_API_PORT=false needs METRICS_PORT, and a picker path that is not
       `/metrics` itself (it would carry the tenant-labelled series).
    4. Every tenant's own webhook secret is a usable `whsec_` secret.
    """
    mode = identity_mode(settings, tenants)
    problems = startup_problems(
        mode, tenants, admins=settings.admins, multi_tenant=settings.enable_multi_tenant
    )  # 1
    if mode is not IdentityMode.GATEWAY and (settings.gateway_peers or settings.gateway_secret):
        problems.append("GATEWAY_PEERS / GATEWAY_SECRET need TENANT_IDENTITY=gateway")
    if mode is IdentityMode.GATEWAY and not (settings.gateway_peers or settings.gateway_secret):
        problems.append(
            "TENANT_IDENTITY=gateway needs GATEWAY_PEERS or GATEWAY_SECRET: without them "
            "anyone who reaches the port names its own tenant"
        )
    if settings.governance_legacy_hmac and not settings.redis_url:  # 2
        problems.append(
            "GOVERNANCE_LEGACY_HMAC=true needs REDIS_URL: seed-form tokens may name no runner "
            "(aud), so every replica must share one nonce store"
        )
    if not settings.metrics_on_api_port:  # 3
        if not settings.metrics_port or settings.metrics_port == settings.port:
            problems.append("METRICS_ON_API_PORT=false needs a METRICS_PORT of its own")
        if settings.picker_metrics_path == "/metrics":
            problems.append(
                "METRICS_ON_API_PORT=false with PICKER_METRICS_PATH=/metrics would hide the "
                "picker's metrics too; give the picker its own path"
            )
    for tenant, secret in sorted(tenants.webhook_secrets.items()):  # 4
        try:
            load_secret(secret, f"tenants file: tenants.{tenant}.webhook_secret")
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise ConfigError("unsafe configuration: " + "; ".join(problems))
