"""Runner configuration, read once at start-up from the environment.

Every variable of the seed contract is here but the vLLM kind's (`VLLM_*`), plus the
runner's own (`HOST`, `PORT`, `RUNNER_ID`, `REDIS_URL`, `MODELS_CONFIG`, ...). Each engine
kind declares its own settings in its package (adapters/<kind>/settings.py) and reads
them from the environment the settings keep (`Settings.environ`) when the runner builds
it. `docs/configuration.md` is the table of all of them; keep them in step.

Invalid configuration never starts a half-configured runner: `load_settings`
raises `ConfigError` whose message names each bad variable and its problem.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Literal

from pydantic import (
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from adapters.kind_settings import GivenSettings
from faults.redis_clients import CLUSTER_SCHEMES, SENTINEL_SCHEMES, cluster_url, sentinel_url
from faults.state_db import MEMORY
from runner.errors import ConfigError
from runner.floor.setting_texts import (
    DEFAULT_OBJECTIVE_PRIORITIES,
    HOST_ENTRY,
    parse_allow_hosts,
    parse_objective_priorities,
)
from tenants.identity import parse_peers
from tenants.rates import parse_rate

PICKER_PATH = "/metrics/picker"
"""PICKER_METRICS_PATH's default: where the endpoint picker's `vllm:*` gauges are served
(runner/telemetry/picker_metrics.py)."""


def _default_runner_id() -> str:
    return f"quorum-{socket.gethostname()}"


class Settings(GivenSettings):
    """All settings; field names are the env var names, case-insensitive."""

    # Seed contract: GPU allocation and model storage.
    cuda_visible_devices: str | None = None
    hf_home: str | None = None
    model_base_path: str = "/models"
    # Seed contract: vLLM engine defaults: the vLLM kind's own (adapters/vllm/settings.py).
    # Seed contract: multi-tenancy and governance.
    enable_multi_tenant: bool = True
    default_rate_limit: str | None = None
    verified_op_token_key_path: str | None = None
    # Seed contract: logging, metrics, queue.
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    log_format: Literal["json", "text"] = "json"
    enable_metrics: bool = True
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    metrics_names: Literal["seed", "quorum", "both"] = "both"  # runner/telemetry/seed_metrics.py
    # false (production): `/metrics`, whose series name tenants, only on METRICS_PORT
    metrics_on_api_port: bool = True
    # The endpoint picker's `vllm:*` family (runner/telemetry/metrics.py); /metrics merges it in.
    # `/metrics` itself (merged) or a path under it, never one of the API's own routes
    picker_metrics_path: str = Field(default=PICKER_PATH, pattern=r"^/metrics(/[A-Za-z0-9._~-]+)*$")
    max_queue_depth: int = Field(default=16, ge=1, le=1_000_000)
    queue_timeout_ms: int = Field(default=30_000, ge=1)

    # The runner's own.
    host: str = "0.0.0.0"
    port: int = Field(default=8080, ge=0, le=65535)
    runner_id: str = Field(default_factory=_default_runner_id, min_length=1, max_length=128)
    redis_url: str | None = None
    # REDIS_MODE=sentinel: the primary is found through these sentinels; REDIS_URL then
    # gives only the user, password, db and TLS (faults/redis_clients.py).
    # REDIS_MODE=cluster: REDIS_URL names any node (and the user, password, TLS);
    # REDIS_CLUSTER_NODES adds more nodes to start from.
    redis_mode: Literal["standalone", "sentinel", "cluster"] = "standalone"
    redis_sentinels: str = ""  # host:port,host:port
    redis_sentinel_service: str = "quorum"  # the name the sentinels monitor the primary by
    redis_cluster_nodes: str = ""  # host:port,host:port
    # Replicas that must acknowledge a spent nonce or a tenant policy change (Redis WAIT)
    # before it is trusted; 0: none; auto: 1 where the primary has replicas, else 0
    # (faults/redis_wait.py).
    nonce_replicas: Annotated[int, Field(ge=0, le=16)] | Literal["auto"] = "auto"
    nonce_replicas_timeout_ms: int = Field(default=500, ge=1, le=10_000)
    models_config: str | None = None
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    engine_connect_timeout_s: float = Field(default=5.0, gt=0)
    engine_read_timeout_s: float = Field(default=300.0, gt=0)
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    # Slow and oversized clients (runner/http/limits.py).
    max_header_bytes: int = Field(default=32_768, ge=1024, le=1_048_576)
    max_headers: int = Field(default=100, ge=8, le=10_000)
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=30.0, gt=0)
    keep_alive_timeout_s: float = Field(default=30.0, gt=0)  # idle after an answer: closed
    max_connections: int = Field(default=1024, ge=1)
    max_connections_per_source: int = Field(default=256, ge=0)  # one TCP peer; 0: no cap
    # of MAX_CONNECTIONS, kept for clients whose first request proves who they are
    authenticated_connection_share: float = Field(default=0.125, ge=0, lt=1)
    # Host names answered besides IP addresses, localhost and HOST: name, .suffix, or *: any
    allowed_hosts: str = ""
    # Scheduling and tenants (tenants/ reads TENANT_RATE_LIMIT_<tenant> itself).
    tenants_file: str | None = None
    # Who a request is (tenants/identity.py, docs/security.md): keys, gateway or open;
    # unset: keys when the tenants file holds a key, else open.
    tenant_identity: Literal["keys", "gateway", "open"] | None = None
    gateway_peers: str = ""  # gateway mode: only these addresses/CIDRs are heard
    gateway_secret: SecretStr | None = Field(default=None, min_length=16)
    auth_failure_source_limit: str = "20/minute"  # failed key checks per source address
    auth_failure_tenant_limit: str = "20/minute"  # ... per tenant named in X-Tenant-ID
    write_stall_timeout_s: float = Field(default=30.0, gt=0)  # a client not reading: cut
    lifecycle_rate_limit: str = "60/minute"  # lifecycle calls per source, before verifying
    rate_limit_fail_open: bool = True
    rate_limit_store_timeout_ms: int = Field(default=250, ge=1, le=60_000)  # connect and command
    queue_low_aging_ms: int = Field(default=10_000, ge=0)
    # Tenant policy on the data path and billable usage (docs/tenants.md).
    token_budget_fail_open: bool = False  # budgets' store unreachable: 503 (or allow)
    token_budget_store_timeout_ms: int = Field(default=250, ge=1, le=60_000)
    # How long a request may wait for requests in flight to settle when only their
    # reservations leave no room (unset: QUEUE_TIMEOUT_MS; 0: refused at once).
    token_budget_wait_ms: int | None = Field(default=None, ge=0, le=3_600_000)
    tenant_permit_ttl_s: float = Field(default=30.0, ge=1, le=3600)  # shared in-flight caps
    usage_db: str = "~/.local/state/quorum/usage.sqlite3"  # embedded: SQLite file
    # Embedded state that outlives the process (faults/state_db.py): unset, `state.sqlite3`
    # beside USAGE_DB; `memory`: none (lost at exit). Not used with REDIS_URL.
    state_db: str | None = None
    state_db_sync: Literal["full", "normal"] = "full"  # normal: a power cut may lose commits
    usage_retention_days: int = Field(default=400, ge=1, le=3660)
    usage_flush_s: float = Field(default=1.0, gt=0, le=60)
    usage_max_keys_per_hour: int = Field(default=10_000, ge=1, le=1_000_000)
    # The gateway's x-llm-d-inference-objective names -> X-Priority (runner/http/headers.py).
    objective_priorities: str = DEFAULT_OBJECTIVE_PRIORITIES
    # Engines the runner starts (docs/engines.md).
    engine_kinds: str = ""  # more engine kinds: module:attr,... (runner/engines/kinds.py)
    engine_traces: bool = True  # with tracing on, a started vLLM exports to its collector
    engine_load_timeout_s: float = Field(default=300.0, gt=0)
    engine_stop_grace_s: float = Field(default=10.0, ge=0)
    unload_drain_timeout_s: float = Field(default=30.0, ge=0)
    engine_restart_backoff_s: float = Field(default=1.0, gt=0)  # the first; then x2, x4, ...
    runner_memory_mb: int | None = Field(default=None, ge=1)
    admin_tenants: str = ""  # comma-separated tenants that may read engine logs
    engine_stats_interval_s: float = Field(default=2.0, gt=0)  # vLLM /metrics, ComfyUI /queue
    engine_probe_misses: int = Field(default=3, ge=1, le=1000)  # runner/engines/probes.py
    engine_probe_timeout_s: float = Field(default=5.0, gt=0)
    # Each engine kind reads its own settings (VLLM_*, COMFYUI_*, WHISPER_*, LLAMA_SERVER_BIN,
    # LLAMA_SLOT_CACHE_ENTRIES, PREFIX_CACHE_*) from `environ` (adapters/<kind>/settings.py).
    images_dir: str | None = None
    images_url_ttl_s: float = Field(default=3600.0, gt=0)
    images_public_url: str | None = None
    # Speech: the audio API and faster-whisper workers (docs/configuration.md).
    audio_max_bytes: int = Field(default=26_214_400, ge=1024)  # OpenAI's 25 MiB
    # Async jobs (Prefer: respond-async) and their signed webhooks.
    webhook_secret: SecretStr | None = None  # whsec_<base64>; checked at start-up
    webhook_allow_hosts: str = ""  # CIDRs and host names webhooks may reach despite the rules
    webhook_timeout_s: float = Field(default=10.0, gt=0)  # one whole delivery attempt
    job_retention_s: int = Field(default=86_400, ge=1)
    jobs_max_per_tenant: int = Field(default=16, ge=1)  # unfinished jobs per tenant (replica)
    job_result_inline_max_bytes: int = Field(default=262_144, ge=1024)  # bigger: image URLs
    # Governance (docs/governance.md).
    governance_registry: str | None = None
    governance_audit_log: str | None = None
    governance_audit_key: str | None = None  # Ed25519 PEM: signs audit records and heads
    governance_legacy_hmac: bool = False
    # The environment these were read from: the engine kinds read their own from it.
    _environ: Mapping[str, str] = PrivateAttr(default_factory=lambda: MappingProxyType({}))

    @property
    def environ(self) -> Mapping[str, str]:
        """The environment the settings were read from (`load_settings`), read-only: each
        engine kind reads its own settings from it (adapters/kind_settings.py)."""
        return self._environ

    @property
    def admins(self) -> frozenset[str]:
        return frozenset(t.strip() for t in self.admin_tenants.split(",") if t.strip())

    @property
    def state_db_path(self) -> str | None:
        """The SQLite file of the embedded state, or None to keep it in memory."""
        if self.state_db == MEMORY:
            return None
        if self.state_db:
            return str(Path(self.state_db).expanduser())
        return str(Path(self.usage_db).expanduser().parent / "state.sqlite3")

    @property
    def budget_wait_ms(self) -> int:
        """TOKEN_BUDGET_WAIT_MS, else QUEUE_TIMEOUT_MS (docs/tenants.md)."""
        wait = self.token_budget_wait_ms
        return self.queue_timeout_ms if wait is None else wait

    @property
    def objectives(self) -> dict[bytes, str]:
        """OBJECTIVE_PRIORITIES as the table the request headers are read with."""
        return parse_objective_priorities(self.objective_priorities)

    @field_validator(
        "auth_failure_source_limit", "auth_failure_tenant_limit", "lifecycle_rate_limit"
    )
    @classmethod
    def _rate(cls, value: str) -> str:
        parse_rate(value)  # ValueError says what was expected
        return value

    @field_validator("webhook_allow_hosts")
    @classmethod
    def _allow_hosts(cls, value: str) -> str:
        parse_allow_hosts(value)  # ValueError names the bad entry
        return value

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, value: str) -> str:
        for entry in (e.strip() for e in value.split(",")):
            if entry and entry != "*" and not HOST_ENTRY.fullmatch(entry):
                raise ValueError(f"{entry!r} is not a host name, an address, a .suffix or *")
        return value

    @field_validator("gateway_peers")
    @classmethod
    def _peers(cls, value: str) -> str:
        parse_peers(value)  # ValueError names the bad entry
        return value

    @field_validator("objective_priorities")
    @classmethod
    def _objective_table(cls, value: str) -> str:
        parse_objective_priorities(value)  # ValueError names the bad entry
        return value

    @field_validator(
        "log_level",
        "log_format",
        "state_db_sync",
        "nonce_replicas",
        mode="before",
    )
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="before")
    @classmethod
    def _sentinel(cls, data: object) -> object:
        """REDIS_MODE=sentinel: `redis_url` becomes the sentinel URL every store's client
        reads (REDIS_SENTINELS, REDIS_SENTINEL_SERVICE, and REDIS_URL's user, password,
        db and TLS), so no store needs to know which mode it runs in; REDIS_MODE=cluster
        likewise (`_cluster`)."""
        if not isinstance(data, dict):
            return data
        mode = str(data.get("redis_mode", "")).lower()
        if mode == "cluster":
            return _cluster(data)
        if mode != "sentinel":
            return data
        sentinels = str(data.get("redis_sentinels") or "")
        if not sentinels:
            raise ValueError("REDIS_MODE=sentinel needs REDIS_SENTINELS (host:port,...)")
        base = data.get("redis_url")
        if base and not str(base).startswith(("redis://", "rediss://")):
            raise ValueError("REDIS_MODE=sentinel: REDIS_URL must be redis:// or rediss://")
        service = str(data.get("redis_sentinel_service") or "quorum")
        return {
            **data,
            "redis_mode": "sentinel",
            "redis_url": sentinel_url(sentinels, service, base),
        }

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        assert value is not None
        schemes = ("redis://", "rediss://", "unix://", *SENTINEL_SCHEMES, *CLUSTER_SCHEMES)
        if not value.startswith(schemes):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value


def _cluster(data: dict[str, object]) -> dict[str, object]:
    """REDIS_MODE=cluster: `redis_url` becomes the cluster URL (faults/redis_clients.py)
    built from REDIS_URL's node, user, password and TLS and REDIS_CLUSTER_NODES."""
    base = data.get("redis_url")
    if base and not str(base).startswith(("redis://", "rediss://")):
        raise ValueError("REDIS_MODE=cluster: REDIS_URL must be redis:// or rediss://")
    nodes = str(data.get("redis_cluster_nodes") or "")
    if not base and not nodes:
        raise ValueError("REDIS_MODE=cluster needs REDIS_URL or REDIS_CLUSTER_NODES (host:port)")
    return {
        **data,
        "redis_mode": "cluster",
        "redis_url": cluster_url(str(base) if base else None, nodes),
    }


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read settings from `environ` (default: the process environment).

    Raises ConfigError naming every invalid variable.
    """
    env = dict(os.environ if environ is None else environ)
    # Empty strings mean "unset" for optional values, as in most container setups.
    known = {name.upper() for name in Settings.model_fields}
    values = {k.lower(): v for k, v in env.items() if k.upper() in known and v != ""}
    try:
        settings = Settings(**values)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            name = str(err["loc"][0]).upper() if err["loc"] else "?"
            problems.append(f"{name}={env.get(name, '')!r}: {err['msg']}")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None
    settings._environ = MappingProxyType(env)
    return settings
