"""Errors raised by the tenants package.

One row per error (`faults.QuorumError.row`); the runner's one mapping turns them into
`{"error": {"code", "message", "type", **extra}}` with their headers.

    QuorumError (faults)
    ├── TenantError (base)
    │   ├── RateLimitExceeded     429 rate_limit_exceeded: limit, remaining, resetAt;
    │   │                             Retry-After and RateLimit-* headers
    │   ├── RateLimitUnavailable  503 rate_limit_unavailable: fail-closed, store down
    │   ├── AuthenticationFailed  401 (WWW-Authenticate: Bearer)
    │   │    ├── MissingApiKey        missing_api_key: keys configured, none sent
    │   │    └── UnknownApiKey        invalid_api_key: the key matches no tenant
    │   └── TenantMismatch        403 tenant_mismatch: X-Tenant-ID is not the key's tenant
    └── ConfigError (faults)
        └── InvalidTenantConfig   invalid_tenant_config: bad env var or tenants file
                                   (start-up only)
"""

from __future__ import annotations

from faults import ConfigError, QuorumError


class TenantError(QuorumError):
    """Root of the tenants package's errors (never raised itself)."""

    code = "tenant_error"


RateLimitExceeded = TenantError.row(
    "RateLimitExceeded", "rate_limit_exceeded", 429, "Tenant {tenant} exceeded {rate}",
    error_type="rate_limit_error", extra=("limit", "remaining", "resetAt"), retry_after=True,
    headers={
        "RateLimit-Limit": "{limit}",
        "RateLimit-Remaining": "{remaining}",
        "RateLimit-Reset": "{reset_after}",
    },
)  # fmt: skip
RateLimitUnavailable = TenantError.row(
    "RateLimitUnavailable", "rate_limit_unavailable", 503,
    "Rate limiting is unavailable (its store is unreachable); retry shortly", retry_after=True,
)  # fmt: skip
AuthenticationFailed = TenantError.row(
    "AuthenticationFailed", "invalid_api_key", 401, headers={"WWW-Authenticate": "Bearer"}
)
MissingApiKey = AuthenticationFailed.row("MissingApiKey", "missing_api_key")
UnknownApiKey = AuthenticationFailed.row("UnknownApiKey", "invalid_api_key")
TenantMismatch = TenantError.row("TenantMismatch", "tenant_mismatch", 403)
InvalidTenantConfig = ConfigError.row("InvalidTenantConfig", "invalid_tenant_config")
