"""Which tenant a request belongs to: its API key when keys are configured, else
X-Tenant-ID, else the gateway's fairness id."""

from __future__ import annotations

from tenants.config import TenantsConfig
from tenants.errors import MissingApiKey, TenantMismatch, UnknownApiKey

DEFAULT_TENANT = "default"
"""The tenant of a request without X-Tenant-ID when no API keys are configured."""


def resolve_tenant(
    authorization: bytes | None,
    x_tenant_id: bytes | None,
    config: TenantsConfig,
    fairness_id: bytes | None = None,
) -> str:
    """The request's tenant id.

    `x_tenant_id` is the X-Tenant-ID header, `fairness_id` the gateway's
    `x-llm-d-inference-fairness-id` (or its older name), each already validated by the
    runner (1-64 of `[A-Za-z0-9._-]`) or None.

    1. No API keys configured: X-Tenant-ID is trusted; without it the fairness id;
       without either, `default`.
    2. Keys configured: `Authorization: Bearer <key>` is required (else 401 missing_api_key).
    3. The key must belong to a tenant (else 401 invalid_api_key).
    4. An X-Tenant-ID naming another tenant is refused (403 tenant_mismatch); the
       fairness id is not checked (the gateway may set it for its own ends).
    5. The key's tenant.
    """
    # 1. no keys: trust the headers
    if not config.has_api_keys:
        claimed = x_tenant_id or fairness_id
        return claimed.decode("ascii") if claimed else DEFAULT_TENANT
    # 2. a bearer key is required
    scheme, _, key = (authorization or b"").strip().partition(b" ")
    key = key.strip()
    if scheme.lower() != b"bearer" or not key:
        raise MissingApiKey("An API key is required: send 'Authorization: Bearer <key>'")
    # 3. the key's tenant
    tenant = config.tenant_for_key(key)
    if tenant is None:
        raise UnknownApiKey("Invalid API key")
    # 4. a disagreeing X-Tenant-ID
    if x_tenant_id and x_tenant_id.decode("ascii") != tenant:
        raise TenantMismatch(
            f"X-Tenant-ID {x_tenant_id.decode('ascii')} does not match the API key's tenant"
        )
    # 5. the key decides
    return tenant
