"""Tenant configuration from env vars and the tenants file."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tenants.config import (
    TenantPolicy,
    TenantsConfig,
    build_config,
    limits_from_env,
    parse_policy_document,
    parse_tenants_file,
)
from tenants.errors import InvalidTenantConfig
from tenants.rates import Rate

LONG_KEY = "k0123456789abcdef0123456789abcdef0"
FILE = """
defaults:
  rate_limit: 50req/min
  weight: 1
  max_queued: 16
tenants:
  community-x:
    rate_limit: 100req/min
    weight: 2
    max_queued: 8
    api_keys: ["sk-x-plain-0123456789abcdef0123456789", "sha256:{digest}"]
  community-y:
    weight: 0.5
  internal:
    rate_limit: unlimited
"""


def tenants_file(tmp_path: Path) -> Path:
    path = tmp_path / "tenants.yaml"
    digest = hashlib.sha256(b"sk-x-hashed").hexdigest()
    path.write_text(FILE.replace("{digest}", digest), encoding="utf-8")
    return path


def test_limits_from_env_reads_tenant_vars_with_dashes_and_dots() -> None:
    """`TENANT_RATE_LIMIT_<tenant>` sets that tenant's limit; ids may hold '-', '.', '_'."""
    env = {
        "TENANT_RATE_LIMIT_community-x": "5req/min",
        "TENANT_RATE_LIMIT_team.a_b": "10req/s",
        "TENANT_RATE_LIMIT_vip": "unlimited",
        "PATH": "/usr/bin",
    }
    assert limits_from_env(env) == {
        "community-x": Rate(5, "minute"),
        "team.a_b": Rate(10, "second"),
        "vip": None,
    }


def test_limits_from_env_tenant_default_wins_over_default_rate_limit() -> None:
    """`TENANT_RATE_LIMIT_default` beats `DEFAULT_RATE_LIMIT` when both are set."""
    env = {"TENANT_RATE_LIMIT_default": "50req/min", "DEFAULT_RATE_LIMIT": "100req/min"}
    assert limits_from_env(env) == {"default": Rate(50, "minute")}


def test_limits_from_env_default_rate_limit_alone_sets_default() -> None:
    """`DEFAULT_RATE_LIMIT` alone is the default; empty values count as unset."""
    env = {"DEFAULT_RATE_LIMIT": "100req/min", "TENANT_RATE_LIMIT_x": " "}
    assert limits_from_env(env) == {"default": Rate(100, "minute")}


def test_limits_from_env_rejects_two_default_spellings() -> None:
    """Two spellings of the tenant default are a conflict, not a silent pick."""
    env = {"TENANT_RATE_LIMIT_default": "1req/s", "TENANT_RATE_LIMIT_DEFAULT": "2req/s"}
    with pytest.raises(InvalidTenantConfig, match="both set the default"):
        limits_from_env(env)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TENANT_RATE_LIMIT_a b": "1req/s"}, "TENANT_RATE_LIMIT_a b: tenant id 'a b'"),
        ({"TENANT_RATE_LIMIT_": "1req/s"}, "TENANT_RATE_LIMIT_: tenant id ''"),
        ({"TENANT_RATE_LIMIT_x": "0req/min"}, "TENANT_RATE_LIMIT_x: rate '0req/min'"),
        ({"DEFAULT_RATE_LIMIT": "fast"}, "DEFAULT_RATE_LIMIT: cannot parse rate 'fast'"),
    ],
)
def test_limits_from_env_errors_name_the_variable(env: dict[str, str], message: str) -> None:
    """A bad variable fails start-up with a message naming it and the problem."""
    with pytest.raises(InvalidTenantConfig, match=f"^{message}"):
        limits_from_env(env)


def test_parse_tenants_file_reads_policies_and_defaults(tmp_path: Path) -> None:
    """The file sets limits, weights, queue caps; missing fields come from `defaults`."""
    config = build_config({}, tenants_file(tmp_path))
    assert config.policy("community-x") == TenantPolicy(Rate(100, "minute"), 2.0, 8)
    assert config.policy("community-y") == TenantPolicy(Rate(50, "minute"), 0.5, 16)
    assert config.policy("internal") == TenantPolicy(None, 1.0, 16)
    assert config.policy("stranger") == TenantPolicy(Rate(50, "minute"), 1.0, 16)
    assert config.rate_for("internal") is None


def test_tenants_config_api_keys_plain_and_hashed(tmp_path: Path) -> None:
    """Plain and `sha256:` keys both identify their tenant; unknown keys identify none."""
    config = build_config({}, tenants_file(tmp_path))
    assert config.has_api_keys
    assert config.tenant_for_key(b"sk-x-plain-0123456789abcdef0123456789") == "community-x"
    assert config.tenant_for_key(b"sk-x-hashed") == "community-x"
    assert config.tenant_for_key(b"sk-x-plain-0123456789abcdef012345678") is None
    assert all(len(digest) == 32 for digest, _ in config.api_keys)
    assert b"sk-x-plain-0123456789abcdef0123456789" not in repr(config).encode()


def test_build_config_env_overrides_file(tmp_path: Path) -> None:
    """Env tenant limits beat the file; the env default reaches file tenants without a limit."""
    env = {"TENANT_RATE_LIMIT_community-x": "5req/min", "DEFAULT_RATE_LIMIT": "7req/s"}
    config = build_config(env, tenants_file(tmp_path))
    assert config.policy("community-x") == TenantPolicy(Rate(5, "minute"), 2.0, 8)
    assert config.policy("community-y") == TenantPolicy(Rate(7, "second"), 0.5, 16)
    assert config.policy("internal").rate_limit is None
    assert config.default == TenantPolicy(Rate(7, "second"), 1.0, 16)


def test_build_config_without_anything_is_unlimited() -> None:
    """No env vars and no file: no tenant has a limit and no keys are required."""
    config = build_config({})
    assert config.rate_for("anyone") is None
    assert not config.has_api_keys
    assert config == config and isinstance(config, TenantsConfig)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tenants: [a, b]", "'tenants' must be a mapping"),
        ("tenant: {}", "unknown key\\(s\\) tenant"),
        ("tenants: {x: {rate: 1req/s}}", "tenants.x: unknown key\\(s\\) rate"),
        ("tenants: {x: {weight: 0}}", "tenants.x.weight: must be a number > 0"),
        ("tenants: {x: {weight: true}}", "tenants.x.weight: must be a number > 0"),
        ("tenants: {x: {max_queued: 0}}", "tenants.x.max_queued: must be an integer >= 1"),
        ("tenants: {x: {rate_limit: 0req/s}}", "tenants.x.rate_limit: rate '0req/s'"),
        ("tenants: {'a b': {}}", "tenants: tenant id 'a b'"),
        ("tenants: {x: {api_keys: k}}", "tenants.x.api_keys: must be a list"),
        ("tenants: {x: {api_keys: ['']}}", "tenants.x.api_keys: every key must be"),
        ("tenants: {x: {api_keys: ['sha256:abc']}}", "'sha256:' needs 64 hex digits"),
        (
            f"tenants: {{x: {{api_keys: [{LONG_KEY}]}}, y: {{api_keys: [{LONG_KEY}]}}}}",
            "also listed for x",
        ),
        ("tenants: {x: {api_keys: [short]}}", "tenants.x.api_keys: a key is shorter than 32"),
        ("tenants: {x: {webhook_secret: s}}", "tenants.x.webhook_secret: must be whsec_"),
        ("tenants: {x: [1", "not valid YAML"),
        ("- 1", "expected a mapping, got list"),
    ],
)
def test_parse_tenants_file_errors_name_file_and_field(text: str, message: str) -> None:
    """A malformed file fails with a message naming the file, the field and the problem."""
    with pytest.raises(InvalidTenantConfig, match=f"^/etc/t.yaml: .*{message}"):
        parse_tenants_file(text, "/etc/t.yaml")


def test_build_config_missing_file_names_path(tmp_path: Path) -> None:
    """An unreadable tenants file fails start-up naming the path."""
    path = tmp_path / "nope.yaml"
    with pytest.raises(InvalidTenantConfig, match=r"nope\.yaml: cannot read tenants file"):
        build_config({}, path)


def test_parse_tenants_file_empty_is_empty() -> None:
    """An empty file is valid and configures nothing."""
    config = parse_tenants_file("", "t.yaml")
    assert dict(config.tenants) == {} and config.default == TenantPolicy()


def test_tenants_config_webhook_secret_is_file_only_and_never_shown() -> None:
    """A tenant's webhook_secret is read from the file, kept apart from the documents that
    `GET /v1/tenants` shows, and refused in a policy sent to `PUT /v1/tenants/{id}`."""
    secret = "whsec_" + "A" * 43 + "="
    config = parse_tenants_file(f"tenants: {{acme: {{webhook_secret: '{secret}'}}}}", "t.yaml")
    assert config.webhook_secrets == {"acme": secret}
    assert "webhook_secret" not in config.documents["acme"]
    assert secret not in repr(config.documents)
    with pytest.raises(InvalidTenantConfig, match="webhook_secret: set it in the tenants file"):
        parse_policy_document("acme", {"webhook_secret": secret})
