"""Who a request is, by mode (`tenants.identity.Identity`): keys, gateway, open; throttled
failures; the configurations that may not start."""

from __future__ import annotations

import hashlib
import ipaddress

import pytest

from tenants.config import build_config, parse_tenants_file
from tenants.errors import (
    MissingApiKey,
    MissingGatewayIdentity,
    TenantMismatch,
    TooManyAuthFailures,
    UnknownApiKey,
    UntrustedGateway,
)
from tenants.identity import (
    AuthLimits,
    Identity,
    IdentityMode,
    default_mode,
    parse_peers,
    startup_problems,
)
from tenants.rates import Rate

KEY_X = "sk-x-0123456789abcdef0123456789abcdef"
KEY_Y = "sk-y-0123456789abcdef0123456789abcdef"
DIGEST = hashlib.sha256(KEY_Y.encode()).hexdigest()
KEYED = parse_tenants_file(
    f"tenants: {{community-x: {{api_keys: [{KEY_X}]}}, "
    f"community-y: {{api_keys: ['sha256:{DIGEST}']}}}}",
    "t.yaml",
)
OPEN = build_config({})
PEER = ("10.1.2.3", 5555)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def bearer(key: str) -> bytes:
    return b"Bearer " + key.encode()


def keyed(**limits: Rate) -> tuple[Identity, Clock]:
    clock = Clock()
    return Identity(KEYED, limits=AuthLimits(**limits), clock=clock), clock


def test_identity_default_mode_is_keys_with_keys_else_open() -> None:
    """Without TENANT_IDENTITY: keys when the tenants file holds a key, else open."""
    assert default_mode(KEYED) is IdentityMode.KEYS
    assert default_mode(OPEN) is IdentityMode.OPEN


def test_identity_open_trusts_the_header_then_the_fairness_id_then_default() -> None:
    """Open mode: X-Tenant-ID, else the gateway's fairness id, else `default`."""
    identify = Identity(OPEN).identify
    assert identify(None, b"community-x", b"t1", None, PEER) == "community-x"
    assert identify(b"Bearer whatever", None, b"t1", None, PEER) == "t1"
    assert identify(b"Bearer whatever", None, None, None, None) == "default"


@pytest.mark.parametrize(
    ("authorization", "tenant"),
    [(bearer(KEY_X), "community-x"), (b"bearer  " + KEY_Y.encode() + b" ", "community-y")],
)
def test_identity_keys_the_key_decides(authorization: bytes, tenant: str) -> None:
    """Keys mode: the bearer key (plain or sha256 in the file) decides the tenant; an
    X-Tenant-ID that agrees is fine; a fairness id is not checked."""
    identify = Identity(KEYED).identify
    assert identify(authorization, None, b"community-y", None, PEER) == tenant
    assert identify(authorization, tenant.encode(), None, None, PEER) == tenant


def test_identity_keys_mismatching_header_is_403() -> None:
    """An X-Tenant-ID naming another tenant than the key's is refused with 403."""
    with pytest.raises(TenantMismatch) as info:
        Identity(KEYED).identify(bearer(KEY_X), b"community-y", None, None, PEER)
    assert (info.value.status, info.value.code) == (403, "tenant_mismatch")


@pytest.mark.parametrize("authorization", [None, b"", b"Bearer", b"Bearer   ", b"Basic sk-x"])
def test_identity_keys_missing_key_is_401(authorization: bytes | None) -> None:
    """Keys mode without a bearer key: 401 missing_api_key with a Bearer challenge."""
    with pytest.raises(MissingApiKey) as info:
        Identity(KEYED).identify(authorization, b"community-x", None, None, PEER)
    assert (info.value.status, info.value.code) == (401, "missing_api_key")
    assert info.value.headers == {"WWW-Authenticate": "Bearer"}


def test_identity_keys_unknown_or_short_key_is_401_without_echo() -> None:
    """A key of no tenant, or one shorter than the minimum, is 401 invalid_api_key; the
    message never repeats it."""
    for key in ("sk-z-0123456789abcdef0123456789abcdef", "sk-x"):
        with pytest.raises(UnknownApiKey) as info:
            Identity(KEYED).identify(bearer(key), None, None, None, PEER)
        assert (info.value.status, info.value.code) == (401, "invalid_api_key")
        assert key not in str(info.value)


def test_identity_keys_failures_throttle_the_source_then_expire() -> None:
    """Past the source's quota of failures its wrong keys are 429 with Retry-After until
    the oldest failure leaves the window; the right key is never refused; other sources
    are not throttled."""
    identity, clock = keyed(per_source=Rate(3, "minute"))
    for _ in range(3):
        with pytest.raises(UnknownApiKey):
            identity.identify(bearer("w" * 40), None, None, None, PEER)
    with pytest.raises(TooManyAuthFailures) as info:
        identity.identify(bearer("v" * 40), None, None, None, PEER)
    assert (info.value.status, info.value.code) == (429, "too_many_auth_failures")
    assert info.value.headers["Retry-After"] == "60"
    assert identity.identify(bearer(KEY_X), None, None, None, PEER) == "community-x"
    with pytest.raises(UnknownApiKey):
        identity.identify(bearer("w" * 40), None, None, None, ("10.9.9.9", 1))
    clock.now += 60
    with pytest.raises(UnknownApiKey):
        identity.identify(bearer("w" * 40), None, None, None, PEER)


def test_identity_keys_failures_naming_a_tenant_throttle_that_tenant_from_that_source() -> None:
    """Failures that name a tenant (X-Tenant-ID) count for (tenant, source): past the quota
    that source's wrong keys naming it are 429; another source naming it is not throttled,
    and the tenant's right key works from anywhere."""
    identity, _ = keyed(per_tenant=Rate(2, "minute"))
    for _ in range(2):
        with pytest.raises(UnknownApiKey):
            identity.identify(bearer("w" * 40), b"community-x", None, None, ("10.0.0.1", 1))
    with pytest.raises(TooManyAuthFailures):
        identity.identify(bearer("w" * 40), b"community-x", None, None, ("10.0.0.1", 1))
    with pytest.raises(UnknownApiKey):
        identity.identify(bearer("w" * 40), b"community-x", None, None, ("10.0.0.9", 1))
    for source in ("10.0.0.1", "10.0.0.9"):
        assert identity.identify(bearer(KEY_X), b"community-x", None, None, (source, 1)) == (
            "community-x"
        )


def test_identity_gateway_takes_the_fairness_id_only() -> None:
    """Gateway mode: the fairness id is the tenant; none is 401 missing_gateway_identity;
    an X-Tenant-ID naming another tenant is 403; an API key changes nothing."""
    identify = Identity(OPEN, IdentityMode.GATEWAY).identify
    assert identify(None, None, b"acme", None, PEER) == "acme"
    assert identify(bearer(KEY_X), b"acme", b"acme", None, PEER) == "acme"
    with pytest.raises(MissingGatewayIdentity) as missing:
        identify(None, b"acme", None, None, PEER)
    assert (missing.value.status, missing.value.code) == (401, "missing_gateway_identity")
    with pytest.raises(TenantMismatch):
        identify(None, b"victim", b"acme", None, PEER)


def test_identity_gateway_peers_and_secret() -> None:
    """GATEWAY_PEERS: only those addresses (IPv4-mapped IPv6 included) are heard;
    GATEWAY_SECRET: only requests carrying it. Anyone else: 403 untrusted_gateway."""
    peers = parse_peers("10.0.0.0/8, fd00::/8")
    identity = Identity(OPEN, IdentityMode.GATEWAY, gateway_peers=peers)
    assert identity.identify(None, None, b"acme", None, PEER) == "acme"
    assert identity.identify(None, None, b"acme", None, ("::ffff:10.0.0.1", 1)) == "acme"
    for client in (("127.0.0.1", 1), None, ("not-an-ip", 1)):
        with pytest.raises(UntrustedGateway):
            identity.identify(None, None, b"acme", None, client)
    secret = Identity(OPEN, IdentityMode.GATEWAY, gateway_secret="s" * 24)
    assert secret.identify(None, None, b"acme", b"s" * 24, PEER) == "acme"
    for sent in (None, b"wrong"):
        with pytest.raises(UntrustedGateway):
            secret.identify(None, None, b"acme", sent, PEER)
    assert peers[0] == ipaddress.ip_network("10.0.0.0/8")
    with pytest.raises(ValueError, match="'nope'"):
        parse_peers("10.0.0.0/8,nope")


def test_identity_single_tenant_is_default() -> None:
    """ENABLE_MULTI_TENANT=false: every request is `default`."""
    assert Identity(OPEN, multi_tenant=False).identify(None, b"x", b"y", None, PEER) == "default"


def test_identity_startup_problems_name_the_settings() -> None:
    """ADMIN_TENANTS in open mode and ENABLE_MULTI_TENANT=false beside keys are refused."""
    open_admins = startup_problems(
        IdentityMode.OPEN, OPEN, admins=frozenset({"ops"}), multi_tenant=True
    )
    assert len(open_admins) == 1 and "ADMIN_TENANTS" in open_admins[0]
    keys_off = startup_problems(IdentityMode.KEYS, KEYED, admins=frozenset(), multi_tenant=False)
    assert len(keys_off) == 1 and "ENABLE_MULTI_TENANT" in keys_off[0]
    assert (
        startup_problems(IdentityMode.KEYS, KEYED, admins=frozenset({"o"}), multi_tenant=True) == []
    )
