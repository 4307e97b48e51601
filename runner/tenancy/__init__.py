"""Tenants as the runner applies them: the policy in force and its live changes, budgets
and entitlements on the data path, shared in-flight caps, billable usage.

`live.LivePolicies` (the tenants file, the governed policies over it, applied on every
replica; SIGHUP re-reads the file), `guard` (token budgets per request: reserve an upper
bound, settle on usage; the OpenAI `x-ratelimit-*` headers), `permits.SharedPermits` (the
scheduler's `PermitEffects` over the Redis semaphore), `usage.UsageRecorder` (per tenant,
model and hour, flushed to SQLite or Redis). Its routes (`/v1/tenants`, `/v1/usage`) are a
request path: `runner/http/tenant_routes.py`.

Decisions are in `tenants/` (pure) and the scheduler; this room carries them out. May
import `tenants`, `governance`, the scheduler's events and the floor (`runner.floor`);
the request paths (`runner.http`) and telemetry import it, never the other way round (a
contract in pyproject.toml).
"""
