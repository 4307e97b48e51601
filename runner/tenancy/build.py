"""What tenancy holds while the runner lives, built from the settings: the budgets' store,
the usage recorder, the policy store and the live policies, and (with Redis) the shared
in-flight permits."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from runner.floor.settings import Settings
from runner.tenancy.live import LivePolicies
from runner.tenancy.permits import SharedPermits
from runner.tenancy.token_budgets import Budgets
from runner.tenancy.usage import UsageRecorder
from tenants.budget_store import MemoryBudgetStore, RedisBudgetStore
from tenants.config import TenantsConfig
from tenants.permit_store import RedisPermitStore
from tenants.policy_store import (
    MemoryPolicyStore,
    PolicyStore,
    PolicyStoreUnavailable,
    RedisPolicyStore,
    SqlitePolicyStore,
)
from tenants.usage_store import RedisUsageStore, SqliteUsageStore, UsageStore

log = logging.getLogger("quorum.tenancy")

DAY_S = 86_400


@dataclass
class Tenancy:
    budgets: Budgets
    usage: UsageRecorder
    policies: LivePolicies
    permits: SharedPermits | None
    _listener: asyncio.Task[None] | None = field(default=None, init=False)

    @classmethod
    def from_settings(
        cls, s: Settings, tenants: TenantsConfig, cap_of: Callable[[str], int | None]
    ) -> Tenancy:
        retention = s.usage_retention_days * DAY_S
        timeout = s.token_budget_store_timeout_ms / 1000
        if s.redis_url:
            budget_store: MemoryBudgetStore | RedisBudgetStore = RedisBudgetStore.from_url(
                s.redis_url, timeout
            )
            usage_store: UsageStore = RedisUsageStore.from_url(s.redis_url, retention)
            policy_store: PolicyStore = RedisPolicyStore.from_url(
                s.redis_url, replicas=s.nonce_replicas, timeout_ms=s.nonce_replicas_timeout_ms
            )
            replica = f"{s.runner_id}:{socket.gethostname()}:{os.getpid()}"
            permits: SharedPermits | None = SharedPermits(
                RedisPermitStore.from_url(s.redis_url),
                s.redis_url,
                replica,
                cap_of,
                ttl_s=s.tenant_permit_ttl_s,
            )
        else:
            budget_store = MemoryBudgetStore()
            usage_store = SqliteUsageStore(s.usage_db)
            state_db = s.state_db_path
            policy_store = (
                SqlitePolicyStore(state_db, s.state_db_sync) if state_db else MemoryPolicyStore()
            )
            permits = None
        return cls(
            budgets=Budgets(
                budget_store,
                fail_open=s.token_budget_fail_open,
                wait_s=s.budget_wait_ms / 1000,
            ),
            usage=UsageRecorder(
                usage_store,
                retention_s=retention,
                flush_s=s.usage_flush_s,
                max_keys=s.usage_max_keys_per_hour,
            ),
            policies=LivePolicies(
                tenants, policy_store, environ=os.environ, tenants_file=s.tenants_file
            ),
            permits=permits,
        )

    async def start(
        self, apply: Callable[[TenantsConfig], None], permit_granted: Callable[[str], None]
    ) -> None:
        """Start-up: the usage flushes, the governed policies read and followed (every
        change applied with `apply`), SIGHUP re-reading the tenants file, the permits."""
        await self.usage.start()
        self.policies.on_change(apply)
        await self._refresh()
        loop = asyncio.get_running_loop()
        self._listener = loop.create_task(self.policies.store.listen(self._refresh))
        if self.permits is not None:
            self.permits.start(permit_granted)
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.add_signal_handler(signal.SIGHUP, self.policies.reread_file)

    async def _refresh(self) -> None:
        try:
            await self.policies.refresh()
        except PolicyStoreUnavailable as exc:
            log.error("tenant policies not read (%s); the ones in force stay", exc)

    async def aclose(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
        await self.usage.aclose()
        await self.budgets.idle()
        await self.budgets.store.aclose()
        await self.policies.store.aclose()
        if self.permits is not None:
            await self.permits.aclose()
