"""Who a request is: one decision, `Identity.identify`, for every path that asks (inference,
async jobs, engine logs, the status page).

Three modes (`TENANT_IDENTITY`), the trust model of docs/security.md:

- `keys`: a bearer API key from the tenants file decides the tenant (X-Tenant-ID may only
  agree with it). The default when the tenants file holds any key.
- `gateway`: the runner sits behind a gateway that authenticates clients and sets the
  Inference Gateway's fairness id (`x-llm-d-inference-fairness-id`, or its older name):
  that id is the tenant, and nothing else is. Optionally only listed peer addresses
  (GATEWAY_PEERS) or requests carrying the gateway's shared secret (GATEWAY_SECRET, header
  `X-Quorum-Gateway-Secret`) are heard.
- `open`: X-Tenant-ID (else the fairness id, else `default`) is believed as sent: a laptop,
  a trusted network. The default without keys; the runner refuses ADMIN_TENANTS in it.

Failed key checks are counted per source address and per (tenant named in X-Tenant-ID or
by a status page user, source address) (`tenants/throttle.py`); past either quota a wrong
key from that source is 429 with Retry-After instead of 401. The key is checked first: a
right key is never refused by the throttle (GitHub's and Stripe's rule), so nobody locks a
tenant out by failing in its name. Failed lifecycle calls count for their source too
(`failed`, from runner/http/control_plane.py).

Cost on the data path: one method call chosen once per mode; open and gateway read the
headers only; keys hashes the key once and compares it with every stored digest; the
throttle is looked at only when a key is wrong.
"""

from __future__ import annotations

import enum
import hmac
import ipaddress
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tenants.config import MIN_API_KEY_CHARS, TenantsConfig
from tenants.errors import (
    MissingApiKey,
    MissingGatewayIdentity,
    TenantMismatch,
    TooManyAuthFailures,
    UnknownApiKey,
    UntrustedGateway,
)
from tenants.rates import Rate
from tenants.throttle import Clock, RecentEvents

DEFAULT_TENANT = "default"
"""The tenant of a request naming none, in open mode (and with ENABLE_MULTI_TENANT off)."""
GATEWAY_SECRET_HEADER = b"x-quorum-gateway-secret"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Client = tuple[str, int] | None
"""The TCP peer as the server reports it (ASGI `scope["client"]`)."""
Identify = Callable[[bytes | None, bytes | None, bytes | None, bytes | None, Client], str]
"""`identify(authorization, x_tenant_id, fairness_id, gateway_secret, client) -> tenant`."""


class IdentityMode(enum.StrEnum):
    KEYS = "keys"
    GATEWAY = "gateway"
    OPEN = "open"


_TWENTY_A_MINUTE = Rate(20, "minute")


@dataclass(frozen=True, slots=True)
class AuthLimits:
    """Failed authentications allowed per source address and per (claimed tenant, source)."""

    per_source: Rate = _TWENTY_A_MINUTE
    per_tenant: Rate = _TWENTY_A_MINUTE


def default_mode(config: TenantsConfig) -> IdentityMode:
    """`keys` when the tenants file holds a key, else `open`."""
    return IdentityMode.KEYS if config.has_api_keys else IdentityMode.OPEN


def parse_peers(text: str) -> tuple[Network, ...]:
    """GATEWAY_PEERS: comma-separated addresses or CIDRs; ValueError names a bad entry."""
    peers = []
    for part in text.split(","):
        if part.strip():
            try:
                peers.append(ipaddress.ip_network(part.strip(), strict=False))
            except ValueError:
                raise ValueError(f"{part.strip()!r} is not an address or CIDR") from None
    return tuple(peers)


def startup_problems(
    mode: IdentityMode, config: TenantsConfig, *, admins: frozenset[str], multi_tenant: bool
) -> list[str]:
    """What makes a configuration unsafe to start (empty: none).

    1. ADMIN_TENANTS in open mode: anyone could claim an admin's id.
    2. ENABLE_MULTI_TENANT=false beside API keys: keys would silently stop being checked.
    """
    problems = []
    if admins and mode is IdentityMode.OPEN:  # 1
        problems.append(
            "ADMIN_TENANTS is set but TENANT_IDENTITY is open (X-Tenant-ID believed as sent): "
            "anyone could read the status page and engine logs; use keys or gateway"
        )
    if not multi_tenant and config.has_api_keys:  # 2
        problems.append(
            "ENABLE_MULTI_TENANT=false with API keys in the tenants file: keys would not be "
            "checked; remove the keys or turn multi-tenancy on"
        )
    return problems


class Identity:
    """The one identification every path uses (see the module docstring)."""

    def __init__(
        self,
        config: TenantsConfig,
        mode: IdentityMode | None = None,
        *,
        multi_tenant: bool = True,
        gateway_peers: Sequence[Network] = (),
        gateway_secret: str | None = None,
        limits: AuthLimits | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        limits = limits or AuthLimits()
        self.config = config
        self.mode = mode or default_mode(config)
        self.gateway_peers = tuple(gateway_peers)
        self.proves = multi_tenant and self.mode is not IdentityMode.OPEN
        """Whether a request can prove who sent it (keys, gateway): the runner keeps a
        share of its connections for those that do (runner/http/reserve.py)."""
        self._secret = gateway_secret.encode() if gateway_secret else None
        self.by_source = RecentEvents(limits.per_source, clock)
        self.by_tenant = RecentEvents(limits.per_tenant, clock)  # keyed "tenant source"
        self.identify: Identify
        if not multi_tenant:
            self.identify = _single
        else:
            self.identify = {
                IdentityMode.KEYS: self._keys,
                IdentityMode.GATEWAY: self._gateway,
                IdentityMode.OPEN: _open,
            }[self.mode]

    def _gateway(
        self,
        authorization: bytes | None,
        tenant_header: bytes | None,
        fairness_id: bytes | None,
        gateway_secret: bytes | None,
        client: Client,
    ) -> str:
        """Gateway mode.

        1. GATEWAY_PEERS set and the peer is not one of them: 403 untrusted_gateway.
        2. GATEWAY_SECRET set and the request does not carry it: 403 untrusted_gateway.
        3. No fairness id: 401 missing_gateway_identity.
        4. An X-Tenant-ID naming another tenant: 403 tenant_mismatch.
        5. The fairness id.
        """
        if self.gateway_peers and not _peer_in(client, self.gateway_peers):  # 1
            raise UntrustedGateway("this runner answers only its gateway (GATEWAY_PEERS)")
        if self._secret is not None and (  # 2
            gateway_secret is None or not hmac.compare_digest(gateway_secret, self._secret)
        ):
            raise UntrustedGateway("this runner answers only its gateway (GATEWAY_SECRET)")
        if fairness_id is None:  # 3
            raise MissingGatewayIdentity()
        if tenant_header is not None and tenant_header != fairness_id:  # 4
            raise TenantMismatch(
                f"X-Tenant-ID {tenant_header.decode('ascii')} is not the gateway's tenant"
            )
        return fairness_id.decode("ascii")  # 5

    def _keys(
        self,
        authorization: bytes | None,
        tenant_header: bytes | None,
        fairness_id: bytes | None,
        gateway_secret: bytes | None,
        client: Client,
    ) -> str:
        """Keys mode.

        1. `Authorization: Bearer <key>` is required (else 401 missing_api_key).
        2. A key long enough that belongs to a tenant: an X-Tenant-ID naming another tenant
           is refused (403 tenant_mismatch; the fairness id is not checked: a gateway may
           set it for its own ends); else the key's tenant. The throttle is not asked: a
           right key is never refused for others' failures.
        3. A wrong key: `failed` (the source, or the tenant X-Tenant-ID names from this
           source, failed too often lately: 429 too_many_auth_failures with Retry-After;
           else the failure is counted, 401 invalid_api_key).
        """
        scheme, _, key = (authorization or b"").strip().partition(b" ")  # 1
        key = key.strip()
        if scheme.lower() != b"bearer" or not key:
            raise MissingApiKey("An API key is required: send 'Authorization: Bearer <key>'")
        tenant = self.config.tenant_for_key(key) if len(key) >= MIN_API_KEY_CHARS else None
        if tenant is not None:  # 2
            if tenant_header is not None and tenant_header.decode("ascii") != tenant:
                raise TenantMismatch(
                    f"X-Tenant-ID {tenant_header.decode('ascii')} does not match the API "
                    "key's tenant"
                )
            return tenant
        claimed = tenant_header.decode("ascii") if tenant_header is not None else None
        self.failed(client[0] if client else "", claimed)  # 3
        raise UnknownApiKey("Invalid API key")

    def failed(self, source: str, tenant: str | None = None) -> None:
        """One failed authentication from `source` (naming `tenant`, if any).

        1. The source, or (tenant, source), is past its quota: 429 too_many_auth_failures
           with Retry-After (this failure is not counted: the window drains).
        2. Else the failure is counted for both; the caller answers its own refusal.
        """
        pair = f"{tenant} {source}" if tenant is not None else None
        wait = self.by_source.retry_after(source)  # 1
        if pair is not None:
            wait = max(wait, self.by_tenant.retry_after(pair))
        if wait:
            raise TooManyAuthFailures(retry_after=wait)
        self.by_source.add(source)  # 2
        if pair is not None:
            self.by_tenant.add(pair)


def _open(
    authorization: bytes | None,
    tenant_header: bytes | None,
    fairness_id: bytes | None,
    gateway_secret: bytes | None,
    client: Client,
) -> str:
    """Open mode: X-Tenant-ID as sent; without it the fairness id; without either `default`."""
    claimed = tenant_header or fairness_id
    return claimed.decode("ascii") if claimed else DEFAULT_TENANT


def _single(
    authorization: bytes | None,
    tenant_header: bytes | None,
    fairness_id: bytes | None,
    gateway_secret: bytes | None,
    client: Client,
) -> str:
    """ENABLE_MULTI_TENANT=false: every request is the one tenant `default`."""
    return DEFAULT_TENANT


def _peer_in(client: Client, peers: tuple[Network, ...]) -> bool:
    if client is None:
        return False
    try:
        address = ipaddress.ip_address(client[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in net for net in peers)
