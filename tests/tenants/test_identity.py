"""Resolving a request's tenant from its API key or X-Tenant-ID."""

from __future__ import annotations

import hashlib

import pytest

from tenants.config import build_config, parse_tenants_file
from tenants.errors import MissingApiKey, TenantMismatch, UnknownApiKey
from tenants.identity import resolve_tenant

DIGEST = hashlib.sha256(b"sk-y").hexdigest()
KEYED = parse_tenants_file(
    "tenants: {community-x: {api_keys: [sk-x]}, "
    f"community-y: {{api_keys: ['sha256:{DIGEST}']}}}}",
    "t.yaml",
)
OPEN = build_config({})


def test_resolve_tenant_without_keys_trusts_header() -> None:
    """With no API keys configured, X-Tenant-ID is the tenant."""
    assert resolve_tenant(None, b"community-x", OPEN) == "community-x"


def test_resolve_tenant_without_keys_or_header_is_default() -> None:
    """With no keys and no X-Tenant-ID, the tenant is `default` (an Authorization is ignored)."""
    assert resolve_tenant(b"Bearer whatever", None, OPEN) == "default"


@pytest.mark.parametrize(
    ("authorization", "tenant"),
    [(b"Bearer sk-x", "community-x"), (b"bearer  sk-y ", "community-y")],
)
def test_resolve_tenant_key_decides(authorization: bytes, tenant: str) -> None:
    """With keys configured, the bearer key (plain or sha256 in the file) decides the tenant."""
    assert resolve_tenant(authorization, None, KEYED) == tenant


def test_resolve_tenant_matching_header_is_accepted() -> None:
    """An X-Tenant-ID that agrees with the key is fine."""
    assert resolve_tenant(b"Bearer sk-x", b"community-x", KEYED) == "community-x"


def test_resolve_tenant_mismatching_header_is_403() -> None:
    """An X-Tenant-ID naming another tenant than the key's is refused with 403."""
    with pytest.raises(TenantMismatch) as info:
        resolve_tenant(b"Bearer sk-x", b"community-y", KEYED)
    assert (info.value.status, info.value.code, info.value.type) == (
        403,
        "tenant_mismatch",
        "permission_error",
    )


@pytest.mark.parametrize("authorization", [None, b"", b"Bearer", b"Bearer   ", b"Basic sk-x"])
def test_resolve_tenant_missing_key_is_401(authorization: bytes | None) -> None:
    """With keys configured, a request without a bearer key is refused with 401."""
    with pytest.raises(MissingApiKey) as info:
        resolve_tenant(authorization, b"community-x", KEYED)
    assert (info.value.status, info.value.code) == (401, "missing_api_key")
    assert info.value.headers == {"WWW-Authenticate": "Bearer"}


def test_resolve_tenant_unknown_key_is_401() -> None:
    """A key that belongs to no tenant is refused with 401 invalid_api_key."""
    with pytest.raises(UnknownApiKey) as info:
        resolve_tenant(b"Bearer sk-z", None, KEYED)
    assert (info.value.status, info.value.code, info.value.type) == (
        401,
        "invalid_api_key",
        "authentication_error",
    )
    assert "sk-z" not in str(info.value)


def test_resolve_tenant_fairness_id_without_header_is_the_tenant() -> None:
    """With no keys and no X-Tenant-ID, the gateway's fairness id is the tenant."""
    assert resolve_tenant(None, None, OPEN, b"t1") == "t1"


def test_resolve_tenant_header_wins_over_fairness_id() -> None:
    """X-Tenant-ID, when present, wins over the gateway's fairness id."""
    assert resolve_tenant(None, b"community-x", OPEN, b"t1") == "community-x"


def test_resolve_tenant_key_wins_over_fairness_id() -> None:
    """With keys configured the key decides; a fairness id naming another tenant is no 403."""
    assert resolve_tenant(b"Bearer sk-x", None, KEYED, b"community-y") == "community-x"
    with pytest.raises(MissingApiKey):
        resolve_tenant(None, None, KEYED, b"community-x")
