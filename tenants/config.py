"""Tenant configuration from the environment and an optional tenants file (pure parsing).

Sources, most specific first:

1. `TENANT_RATE_LIMIT_<tenant>=100req/min` sets one tenant's limit (overrides the file);
2. the tenants file's `tenants.<id>.rate_limit`;
3. the default limit, for every tenant without its own: `TENANT_RATE_LIMIT_default`,
   else `DEFAULT_RATE_LIMIT`, else the file's `defaults.rate_limit`, else none (unlimited).

Any limit may be `unlimited`. API keys exist only in the file; they are kept as sha256
digests and compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from tenants.errors import InvalidTenantConfig
from tenants.policy import (
    EVERY_MODEL,
    Entitlements,
    TokenBudget,
    parse_budgets,
    parse_in_flight,
    parse_models,
    parse_priority,
)
from tenants.rates import Rate, check_tenant_id, parse_limit, parse_rate

__all__ = [
    "DEFAULT_VAR",
    "TENANT_VAR_PREFIX",
    "Rate",
    "TenantPolicy",
    "TenantsConfig",
    "build_config",
    "limits_from_env",
    "parse_policy_document",
    "parse_rate",
    "parse_tenants_file",
    "read_tenants_file",
]

TENANT_VAR_PREFIX = "TENANT_RATE_LIMIT_"
DEFAULT_VAR = "DEFAULT_RATE_LIMIT"
DEFAULT = "default"
"""Key of the default limit in `limits_from_env`'s result (`TENANT_RATE_LIMIT_default`)."""
MIN_API_KEY_CHARS = 32
"""A plain key in the file shorter than this stops start-up (`quorum tenants keygen` makes
43); presented keys shorter than this are refused without a lookup (tenants/identity.py)."""


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """What applies to one tenant: its effective rate limit (None: unlimited), its fair-share
    weight, its cap on queued requests (None: only the global queue cap), the models it may
    use, its priority default and ceiling, its cap on requests at the engines (None: none)
    and its token budgets (tenants/policy.py)."""

    rate_limit: Rate | None = None
    weight: float = 1.0
    max_queued: int | None = None
    models: Entitlements = EVERY_MODEL
    priority_default: str = "normal"
    priority_max: str = "normal"  # `high` only where the tenants file grants it
    max_in_flight: int | None = None
    token_budgets: tuple[TokenBudget, ...] = ()

    def with_rate(self, rate: Rate | None) -> TenantPolicy:
        return replace(self, rate_limit=rate)


@dataclass(frozen=True, slots=True, eq=False)
class TenantsConfig:
    """Every tenant's policy, the default policy, the API keys (sha256 digest, tenant) and
    the tenants' own webhook secrets (`whsec_...`, checked by the runner at start-up)."""

    tenants: Mapping[str, TenantPolicy] = field(default_factory=lambda: MappingProxyType({}))
    default: TenantPolicy = TenantPolicy()
    api_keys: tuple[tuple[bytes, str], ...] = ()
    documents: Mapping[str, Mapping[str, object]] = field(
        default_factory=lambda: MappingProxyType({}), repr=False
    )  # each listed tenant's policy as written (keys as digests), for `GET /v1/tenants`
    webhook_secrets: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def policy(self, tenant: str) -> TenantPolicy:
        """The tenant's own policy, or the default one."""
        return self.tenants.get(tenant, self.default)

    @property
    def declared(self) -> frozenset[str]:
        """The tenants the configuration names (file, API, env), and `default`."""
        return frozenset(self.tenants) | {"default"}

    def rate_for(self, tenant: str) -> Rate | None:
        return self.tenants.get(tenant, self.default).rate_limit

    @property
    def has_api_keys(self) -> bool:
        return bool(self.api_keys)

    def tenant_for_key(self, key: bytes) -> str | None:
        """The tenant owning `key`, comparing its digest with every stored one (no early exit)."""
        digest = hashlib.sha256(key).digest()
        found: str | None = None
        for stored, tenant in self.api_keys:
            if hmac.compare_digest(stored, digest):
                found = tenant
        return found


def limits_from_env(environ: Mapping[str, str]) -> dict[str, Rate | None]:
    """Rate limits from `TENANT_RATE_LIMIT_<tenant>` and `DEFAULT_RATE_LIMIT`.

    The result maps tenant ids to rates (None: `unlimited`); the key `default`, when present,
    is the default limit. Empty values count as unset.

    1. `TENANT_RATE_LIMIT_default` (any case of `default`) sets the default;
    2. every other `TENANT_RATE_LIMIT_<tenant>` sets that tenant's limit (ids are validated);
    3. `DEFAULT_RATE_LIMIT` sets the default only when step 1 did not.
    """
    result: dict[str, Rate | None] = {}
    default_source: str | None = None
    for name, value in environ.items():
        if not name.startswith(TENANT_VAR_PREFIX) or not value.strip():
            continue
        tenant = name[len(TENANT_VAR_PREFIX) :]
        # 1. the tenant-scoped default
        if tenant.lower() == DEFAULT:
            if default_source is not None:
                raise InvalidTenantConfig(f"{name} and {default_source} both set the default")
            default_source = name
            result[DEFAULT] = parse_limit(value, name)
            continue
        # 2. one tenant's limit
        check_tenant_id(tenant, name)
        result[tenant] = parse_limit(value, name)
    # 3. DEFAULT_RATE_LIMIT, the fallback default
    value = environ.get(DEFAULT_VAR, "")
    if value.strip():
        rate = parse_limit(value, DEFAULT_VAR)
        if default_source is None:
            result[DEFAULT] = rate
    return result


def parse_tenants_file(text: str, source: str) -> TenantsConfig:
    """Parse a tenants file (YAML); `source` (its path) names it in errors.

    ```yaml
    defaults: {rate_limit: 50req/min, weight: 1, max_queued: 16}
    tenants:
      community-x:
        rate_limit: 100req/min      # or `unlimited`; absent: the default limit
        weight: 2                   # fair-share weight, > 0
        max_queued: 8               # per-tenant queue cap, >= 1
        api_keys: ["sha256:<64 hex>", "a-plain-key-of-32-characters-or-more"]
        models: ["gemma-*"]         # and priority, max_in_flight, token_budgets:
        webhook_secret: whsec_...   # tenants/policy.py; the secret: this file only
    ```
    """
    return _parse_doc(_load_yaml(text, source), source)[0]


def read_tenants_file(tenants_file: str | Path | None) -> dict[str, Any]:
    """The tenants file as a document (`{}` without one); unreadable or not YAML: raise."""
    if tenants_file is None:
        return {}
    path = Path(tenants_file)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidTenantConfig(f"{path}: cannot read tenants file: {exc}") from None
    return _load_yaml(text, str(path))


def build_config(
    environ: Mapping[str, str],
    tenants_file: str | Path | None = None,
    overrides: Mapping[str, Mapping[str, object] | None] | None = None,
    file_doc: Mapping[str, Any] | None = None,
) -> TenantsConfig:
    """The effective configuration: the file (if any), the governed policies (`overrides`:
    tenant -> policy document, None: deleted) over it, and the env vars over both.

    1. read and parse the file (or take `file_doc`, already read), with each tenant the
       overrides name replaced by its governed policy (or removed);
    2. the env default (if set) replaces the file's default limit;
    3. tenants without their own `rate_limit` follow the (new) default;
    4. each env tenant limit replaces that tenant's limit (a tenant only named in the env
       gets the default policy otherwise).
    """
    # 1. the file and the governed policies
    source = str(tenants_file) if tenants_file is not None else "tenants"
    doc = dict(file_doc) if file_doc is not None else read_tenants_file(tenants_file)
    if overrides:
        entries = dict(doc.get("tenants") or {})
        for tenant, policy in overrides.items():
            entries.pop(tenant, None)
            if policy is not None:
                entries[tenant] = dict(policy)
        doc["tenants"] = entries
    base, own_rate = _parse_doc(doc, source) if doc else (TenantsConfig(), frozenset[str]())
    env = limits_from_env(environ)
    # 2. the default
    default = base.default
    if DEFAULT in env:
        default = default.with_rate(env[DEFAULT])
    # 3. file tenants
    tenants = {
        tenant: policy if tenant in own_rate else policy.with_rate(default.rate_limit)
        for tenant, policy in base.tenants.items()
    }
    # 4. env tenants
    for tenant, rate in env.items():
        if tenant != DEFAULT:
            tenants[tenant] = tenants.get(tenant, default).with_rate(rate)
    return TenantsConfig(
        MappingProxyType(tenants),
        default,
        base.api_keys,
        MappingProxyType(base.documents),
        base.webhook_secrets,
    )


def parse_policy_document(tenant: str, doc: object, source: str = "policy") -> TenantPolicy:
    """Check one tenant's policy as `PUT /v1/tenants/{id}` sends it (the file's schema for a
    tenant; API keys only as `sha256:<64 hex>`; no `webhook_secret`: a secret belongs in the
    file, never in a document the store keeps and admins read). Raises InvalidTenantConfig
    naming the field."""
    where = f"{source} of {check_tenant_id(tenant, source)}"
    policy = _policy(doc, where, TenantPolicy(), True)
    assert isinstance(doc, dict)
    if "webhook_secret" in doc:
        raise InvalidTenantConfig(f"{where}.webhook_secret: set it in the tenants file only")
    keys = doc.get("api_keys") or []
    if isinstance(keys, list) and any(not str(k).startswith("sha256:") for k in keys):
        raise InvalidTenantConfig(f"{where}.api_keys: send keys as sha256:<64 hex> only")
    _api_keys(doc.get("api_keys"), where)
    return policy


def _load_yaml(text: str, source: str) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidTenantConfig(f"{source}: not valid YAML: {exc}") from None
    doc = {} if doc is None else doc
    _check_keys(doc, {"defaults", "tenants"}, source)
    assert isinstance(doc, dict)
    return doc


def _parse_doc(doc: Mapping[str, Any], source: str) -> tuple[TenantsConfig, frozenset[str]]:
    """The document's config and the tenants that set their own `rate_limit`."""
    _check_keys(doc, {"defaults", "tenants"}, source)
    default = _policy(doc.get("defaults") or {}, f"{source}: defaults", TenantPolicy(), False)
    entries = doc.get("tenants") or {}
    if not isinstance(entries, dict):
        raise InvalidTenantConfig(f"{source}: 'tenants' must be a mapping of tenant id to policy")
    tenants: dict[str, TenantPolicy] = {}
    documents: dict[str, Mapping[str, object]] = {}
    own_rate: set[str] = set()
    keys: dict[bytes, str] = {}
    secrets: dict[str, str] = {}
    for raw_id, raw_entry in entries.items():
        tenant = check_tenant_id(str(raw_id), f"{source}: tenants")
        where = f"{source}: tenants.{tenant}"
        entry = raw_entry or {}
        tenants[tenant] = _policy(entry, where, default, True)
        if entry.get("rate_limit") is not None:
            own_rate.add(tenant)
        digests = _api_keys(entry.get("api_keys"), where)
        for digest in digests:
            if digest in keys:
                raise InvalidTenantConfig(f"{where}: an API key is also listed for {keys[digest]}")
            keys[digest] = tenant
        secret = entry.get("webhook_secret")
        if secret is not None:
            if not isinstance(secret, str) or not secret.startswith("whsec_"):
                raise InvalidTenantConfig(f"{where}.webhook_secret: must be whsec_<base64>")
            secrets[tenant] = secret
        shown = {k: v for k, v in entry.items() if k != "webhook_secret"}  # never shown
        documents[tenant] = {
            **shown,
            **({"api_keys": [f"sha256:{d.hex()}" for d in digests]} if "api_keys" in entry else {}),
        }
    config = TenantsConfig(
        MappingProxyType(tenants),
        default,
        tuple(keys.items()),
        MappingProxyType(documents),
        MappingProxyType(secrets),
    )
    return config, frozenset(own_rate)


def _check_keys(doc: object, allowed: set[str], where: str) -> None:
    if not isinstance(doc, dict):
        raise InvalidTenantConfig(f"{where}: expected a mapping, got {type(doc).__name__}")
    unknown = sorted(str(k) for k in doc if k not in allowed)
    if unknown:
        raise InvalidTenantConfig(
            f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )


_POLICY_KEYS = {
    "rate_limit",
    "weight",
    "max_queued",
    "models",
    "priority",
    "max_in_flight",
    "token_budgets",
}


def _policy(entry: object, where: str, default: TenantPolicy, is_tenant: bool) -> TenantPolicy:
    allowed = _POLICY_KEYS | ({"api_keys", "webhook_secret"} if is_tenant else set())
    _check_keys(entry, allowed, where)
    assert isinstance(entry, dict)
    rate = default.rate_limit
    if entry.get("rate_limit") is not None:
        rate = parse_limit(str(entry["rate_limit"]), f"{where}.rate_limit")
    weight = entry.get("weight", default.weight)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
        raise InvalidTenantConfig(f"{where}.weight: must be a number > 0, got {weight!r}")
    max_queued = entry.get("max_queued", default.max_queued)
    if max_queued is not None and (
        isinstance(max_queued, bool) or not isinstance(max_queued, int) or max_queued < 1
    ):
        raise InvalidTenantConfig(
            f"{where}.max_queued: must be an integer >= 1, got {max_queued!r}"
        )
    inherited = (default.priority_default, default.priority_max)
    asked, ceiling = parse_priority(entry.get("priority"), where, inherited)
    models = parse_models(entry.get("models"), where) if "models" in entry else None
    in_flight = parse_in_flight(entry.get("max_in_flight"), where)
    budgets = parse_budgets(entry.get("token_budgets"), where)
    return TenantPolicy(
        rate_limit=rate,
        weight=float(weight),
        max_queued=max_queued,
        models=Entitlements(models) if "models" in entry else default.models,
        priority_default=asked,
        priority_max=ceiling,
        max_in_flight=in_flight if "max_in_flight" in entry else default.max_in_flight,
        token_budgets=budgets if "token_budgets" in entry else default.token_budgets,
    )


def _api_keys(raw: object, where: str) -> list[bytes]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InvalidTenantConfig(f"{where}.api_keys: must be a list of strings")
    digests = []
    for key in raw:
        if not isinstance(key, str) or not key.strip():
            raise InvalidTenantConfig(f"{where}.api_keys: every key must be a non-empty string")
        if key.startswith("sha256:"):
            try:
                digest = bytes.fromhex(key[len("sha256:") :])
            except ValueError:
                digest = b""
            if len(digest) != 32:
                raise InvalidTenantConfig(f"{where}.api_keys: 'sha256:' needs 64 hex digits")
            digests.append(digest)
        else:
            if len(key.strip()) < MIN_API_KEY_CHARS:
                raise InvalidTenantConfig(
                    f"{where}.api_keys: a key is shorter than {MIN_API_KEY_CHARS} characters "
                    "(make one with `quorum tenants keygen`)"
                )
            digests.append(hashlib.sha256(key.encode("utf-8")).digest())
    return digests
