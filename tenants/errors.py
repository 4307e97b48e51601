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
    │   ├── MissingGatewayIdentity 401 missing_gateway_identity: gateway mode, no fairness id
    │   ├── TenantMismatch        403 tenant_mismatch: X-Tenant-ID is not the key's (or the
    │   │                             gateway's) tenant
    │   ├── UntrustedGateway      403 untrusted_gateway: gateway mode, not from its peers or
    │   │                             without its shared secret
    │   ├── TooManyAuthFailures   429 too_many_auth_failures: this source or the tenant it
    │   │                             names failed too often lately; Retry-After
    │   ├── ModelNotAllowed       403 model_not_allowed: not in the tenant's `models`
    │   ├── TokenBudgetExceeded   429 token_budget_exceeded: budget, remaining, requested,
    │   │                             resetAt; Retry-After and x-ratelimit-*-tokens
    │   ├── RequestExceedsBudget  400 request_exceeds_budget: could never fit the budget
    │   └── TokenBudgetUnavailable 503 token_budget_unavailable: budget store unreachable
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
    "RateLimitExceeded",
    "rate_limit_exceeded",
    429,
    "Tenant {tenant} exceeded {rate}",
    error_type="rate_limit_error",
    extra=("limit", "remaining", "resetAt"),
    retry_after=True,
    headers={
        "RateLimit-Limit": "{limit}",
        "RateLimit-Remaining": "{remaining}",
        "RateLimit-Reset": "{reset_after}",
    },
)
RateLimitUnavailable = TenantError.row(
    "RateLimitUnavailable",
    "rate_limit_unavailable",
    503,
    "Rate limiting is unavailable (its store is unreachable); retry shortly",
    retry_after=True,
)
AuthenticationFailed = TenantError.row(
    "AuthenticationFailed", "invalid_api_key", 401, headers={"WWW-Authenticate": "Bearer"}
)
MissingApiKey = AuthenticationFailed.row("MissingApiKey", "missing_api_key")
UnknownApiKey = AuthenticationFailed.row("UnknownApiKey", "invalid_api_key")
TenantMismatch = TenantError.row("TenantMismatch", "tenant_mismatch", 403)
ModelNotAllowed = TenantError.row(
    "ModelNotAllowed",
    "model_not_allowed",
    403,
    "Tenant {tenant} may not use model {model!r}; its models: {allowed}",
    extra=("model",),
)
TokenBudgetExceeded = TenantError.row(
    "TokenBudgetExceeded",
    "token_budget_exceeded",
    429,
    "Tenant {tenant} has {remaining} of its {budget_text} left; this request may use {requested}",
    error_type="rate_limit_error",
    extra=("budget", "remaining", "requested", "resetAt"),
    retry_after=True,
    headers={
        "x-ratelimit-limit-tokens": "{limit}",
        "x-ratelimit-remaining-tokens": "{remaining}",
        "x-ratelimit-reset-tokens": "{reset}",
    },
)
RequestExceedsBudget = TenantError.row(
    "RequestExceedsBudget",
    "request_exceeds_budget",
    400,
    "This request may use {requested} tokens, more than tenant {tenant}'s whole "
    "{budget_text}; lower max_tokens (or send it) or the prompt",
    extra=("budget", "requested"),
)
TokenBudgetUnavailable = TenantError.row(
    "TokenBudgetUnavailable",
    "token_budget_unavailable",
    503,
    "Token budgets are unavailable (their store is unreachable); retry shortly",
    retry_after=True,
)
MissingGatewayIdentity = TenantError.row(
    "MissingGatewayIdentity",
    "missing_gateway_identity",
    401,
    "This runner takes the tenant from its gateway (x-llm-d-inference-fairness-id), and the "
    "request carries none",
)
UntrustedGateway = TenantError.row("UntrustedGateway", "untrusted_gateway", 403)
TooManyAuthFailures = TenantError.row(
    "TooManyAuthFailures",
    "too_many_auth_failures",
    429,
    "Too many failed authentications; retry in {retry_after} seconds",
    error_type="rate_limit_error",
    retry_after=True,
)
InvalidTenantConfig = ConfigError.row("InvalidTenantConfig", "invalid_tenant_config")
