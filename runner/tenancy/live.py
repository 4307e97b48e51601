"""The tenant policies in force, and their changes while the runner runs.

The configuration is the tenants file with the governed policies (`PUT`/`DELETE
/v1/tenants/{id}`, kept in the policy store) over it, and the env's rate limits over
both (tenants/config.py `build_config`). A change is applied at once on the replica that
took it and, through the store (Redis: the version bumped and published), on every other
within a second; `SIGHUP` re-reads the file (a governed policy keeps winning over the
file until it is deleted). Applying means: identity (API keys: a rotated key works at once
and the old one is refused at once), rate limits, the scheduler's weights and caps, the
metrics' declared tenants, and every later request's policy. A request already admitted
keeps the policy it was admitted under; budget windows and reservations are kept (they
are keyed by the budget, not by its amount).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from runner.scheduler.events import TenantsChanged
from tenants.config import TenantsConfig, build_config, read_tenants_file
from tenants.errors import InvalidTenantConfig
from tenants.policy_store import PolicyRecord, PolicyStore

log = logging.getLogger("quorum.tenancy.policies")

Apply = Callable[[TenantsConfig], None]


def tenants_event(config: TenantsConfig, now: float) -> TenantsChanged:
    """What the scheduler needs of a configuration."""
    policies = config.tenants
    default = config.default
    return TenantsChanged(
        tenant_weights={t: p.weight for t, p in policies.items()},
        default_weight=default.weight,
        tenant_queue_caps={t: p.max_queued for t, p in policies.items() if p.max_queued},
        default_tenant_queue_cap=default.max_queued,
        tenant_in_flight_caps={t: p.max_in_flight for t, p in policies.items() if p.max_in_flight},
        default_in_flight_cap=default.max_in_flight,
        at=now,
    )


class LivePolicies:
    def __init__(
        self,
        current: TenantsConfig,
        store: PolicyStore,
        *,
        environ: Mapping[str, str],
        tenants_file: str | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.current = current
        self.store = store
        self.environ = dict(environ)
        self.tenants_file = tenants_file
        self.version = 0
        self.records: dict[str, PolicyRecord] = {}
        self._clock = clock
        self._file_doc: dict[str, Any] | None = None
        self._apply: list[Apply] = []

    def on_change(self, apply: Apply) -> None:
        self._apply.append(apply)

    def _file(self) -> dict[str, Any]:
        if self._file_doc is None:
            self._file_doc = read_tenants_file(self.tenants_file) if self.tenants_file else {}
        return self._file_doc

    def build(self, records: Mapping[str, PolicyRecord]) -> TenantsConfig:
        overrides = {t: r.policy for t, r in records.items()}
        return build_config(self.environ, self.tenants_file, overrides, file_doc=self._file())

    def check(self, tenant: str, policy: Mapping[str, Any] | None) -> None:
        """Raise InvalidTenantConfig if the configuration with this change is invalid (an
        API key another tenant has already)."""
        self.build({**self.records, tenant: PolicyRecord(tenant, policy, 0, "")})

    def source(self, tenant: str) -> str | None:
        """`api` (a governed policy), `file`, or None (unknown here)."""
        if tenant in self.records:
            return "api"
        return "file" if tenant in self.current.documents else None

    async def refresh(self) -> None:
        """Read the store; apply when its version moved (called on every notification)."""
        version, records = await self.store.snapshot()
        if version == self.version:
            return
        try:
            config = self.build(records)
        except InvalidTenantConfig as exc:  # a store someone edited by hand
            log.error("tenant policies version %d not applied: %s", version, exc)
            return
        self.version, self.records = version, records
        self._set(config)
        log.info("tenant policies version %d applied", version)

    async def put(
        self,
        tenant: str,
        policy: Mapping[str, Any] | None,
        sha256: str,
        approved_by: tuple[str, ...],
    ) -> PolicyRecord:
        """Store an approved change, then apply it here at once."""
        record = await self.store.put(tenant, policy, sha256, approved_by, self._clock())
        await self.refresh()
        return record

    def reread_file(self) -> None:
        """SIGHUP: read the tenants file again; a file that does not parse is logged and
        the policies in force stay."""
        previous = self._file_doc
        try:
            self._file_doc = read_tenants_file(self.tenants_file) if self.tenants_file else {}
            config = self.build(self.records)
        except InvalidTenantConfig as exc:
            self._file_doc = previous
            log.error("tenants file not reloaded: %s", exc)
            return
        self._set(config)
        log.info("tenants file %s reloaded", Path(self.tenants_file or "-").name)

    def _set(self, config: TenantsConfig) -> None:
        self.current = config
        for apply in self._apply:
            apply(config)
