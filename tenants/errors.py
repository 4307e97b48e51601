"""Errors raised by the tenants package.

Every error that can reach a client carries `status` (HTTP), `code` (machine
code), `type` (OpenAI-style error type), a human message (`str(exc)`), extra
body fields in `extra` and response headers in `headers`; the runner's error
map turns them into `{"error": {"code", "message", "type", **extra}}`.

    TenantError
     ├── RateLimitExceeded     429 rate_limit_exceeded: limit, remaining, resetAt;
     │                             Retry-After and RateLimit-* headers
     ├── RateLimitUnavailable  503 rate_limit_unavailable: fail-closed, store down
     ├── AuthenticationFailed  401 (WWW-Authenticate: Bearer)
     │    ├── MissingApiKey        missing_api_key: keys configured, none sent
     │    └── UnknownApiKey        invalid_api_key: the key matches no tenant
     ├── TenantMismatch        403 tenant_mismatch: X-Tenant-ID is not the key's tenant
     └── InvalidTenantConfig   500 invalid_tenant_config: bad env var or tenants file
                                   (start-up only; also a ValueError)
"""

from __future__ import annotations

from typing import ClassVar


class TenantError(Exception):
    """Base of every error the tenants package raises."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "tenant_error"
    type: ClassVar[str] = "server_error"

    def __init__(
        self,
        message: str,
        *,
        extra: dict[str, object] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.extra: dict[str, object] = extra or {}
        self.headers: dict[str, str] = headers or {}


class RateLimitExceeded(TenantError):
    """The tenant used up its window; the body says when it resets."""

    status = 429
    code = "rate_limit_exceeded"
    type = "rate_limit_error"

    def __init__(
        self,
        tenant: str,
        rate_text: str,
        *,
        limit: int,
        remaining: int,
        reset_at: int,
        reset_after_s: int,
        retry_after_s: int,
    ) -> None:
        super().__init__(
            f"Tenant {tenant} exceeded {rate_text}",
            extra={"limit": limit, "remaining": remaining, "resetAt": reset_at},
            headers={
                "Retry-After": str(retry_after_s),
                "RateLimit-Limit": str(limit),
                "RateLimit-Remaining": str(remaining),
                "RateLimit-Reset": str(reset_after_s),
            },
        )
        self.tenant = tenant
        self.retry_after_s = retry_after_s


class RateLimitUnavailable(TenantError):
    """The shared rate-limit store is unreachable and the limiter fails closed."""

    status = 503
    code = "rate_limit_unavailable"
    type = "server_error"

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(
            "Rate limiting is unavailable (its store is unreachable); retry shortly",
            headers={"Retry-After": str(max(1, retry_after_s))},
        )


class AuthenticationFailed(TenantError):
    """API keys are configured and the request did not present a valid one."""

    status = 401
    code = "invalid_api_key"
    type = "authentication_error"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class MissingApiKey(AuthenticationFailed):
    """No `Authorization: Bearer <key>` header although keys are configured."""

    code = "missing_api_key"


class UnknownApiKey(AuthenticationFailed):
    """The bearer key matches no tenant."""

    code = "invalid_api_key"


class TenantMismatch(TenantError):
    """X-Tenant-ID names a different tenant than the one the API key belongs to."""

    status = 403
    code = "tenant_mismatch"
    type = "permission_error"


class InvalidTenantConfig(TenantError, ValueError):
    """A rate-limit env var or the tenants file is malformed (raised at start-up)."""

    status = 500
    code = "invalid_tenant_config"
    type = "server_error"
