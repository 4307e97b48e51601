"""What the async jobs hold while the runner lives, built from the settings: the job store
(Redis with REDIS_URL, else SQLite in STATE_DB, else memory with STATE_DB=memory), the
manager, and, when any webhook can be signed (WEBHOOK_SECRET, or a tenant's own secret),
the webhook client and sender, which posts only where the outbound policy allows
(runner/jobs/outbound.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from runner.floor.settings import Settings
from runner.jobs.manager import JobManager
from runner.jobs.outbound import AllowList, Endpoints, OutboundPolicy
from runner.jobs.sqlite_store import SqliteJobStore
from runner.jobs.store import JobStore, MemoryJobStore, RedisJobStore
from runner.jobs.webhooks import WebhookSender
from tenants.config import TenantsConfig


@dataclass
class Jobs:
    store: JobStore
    manager: JobManager
    webhook_client: httpx.AsyncClient | None  # closed with the runner

    @classmethod
    def from_settings(
        cls,
        s: Settings,
        tenants: TenantsConfig,
        own_endpoints: Endpoints,
        on_finished: Callable[[str, str], None],
    ) -> Jobs:
        """`own_endpoints`: where the runner and its engines listen, asked at each check
        (`endpoints_of`); `on_finished(kind, outcome)`: each job that ends, once."""
        store: JobStore
        if s.redis_url:
            store = RedisJobStore.from_url(s.redis_url, retention_s=s.job_retention_s)
        elif state_db := s.state_db_path:
            store = SqliteJobStore(
                state_db, time.time, retention_s=s.job_retention_s, sync=s.state_db_sync
            )
        else:
            store = MemoryJobStore(time.time, retention_s=s.job_retention_s)
        client, sender = None, None
        shared = s.webhook_secret.get_secret_value() if s.webhook_secret is not None else None
        if shared is not None or tenants.webhook_secrets:  # checked at start-up
            client = httpx.AsyncClient(follow_redirects=False, trust_env=False)
            policy = OutboundPolicy(
                allow=AllowList.parse(s.webhook_allow_hosts), own_endpoints=own_endpoints
            )
            sender = WebhookSender(
                client,
                shared,
                secrets=tenants.webhook_secrets,
                policy=policy,
                timeout_s=s.webhook_timeout_s,
            )
        manager = JobManager(
            store,
            sender,
            s.runner_id,
            time.time,
            max_per_tenant=s.jobs_max_per_tenant,
            on_finished=on_finished,
        )
        return cls(store, manager, client)


def endpoints_of(ports: Iterable[int], urls: Iterable[str]) -> list[tuple[str, int]]:
    """Where the runner and its engines listen, as (address or name, port): its own
    `ports` on loopback, and the host and port of each http(s) URL of its engines (one on
    a Unix socket is out of reach already)."""
    found = [("127.0.0.1", port) for port in ports]
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme in ("http", "https") and parts.hostname:
            try:
                port = parts.port or (443 if parts.scheme == "https" else 80)
            except ValueError:
                continue
            found.append((parts.hostname, port))
    return found
