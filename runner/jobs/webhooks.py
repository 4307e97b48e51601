"""Webhooks: signed with the Standard Webhooks scheme, retried with capped exponential backoff.

A finished job's event is posted to its `webhook` URL as JSON::

    {"type": "job.succeeded", "timestamp": "2026-01-01T00:00:00Z", "data": <GET body>}

with the three headers of the Standard Webhooks specification, made by the
`standardwebhooks` library from the job's tenant's own secret (the tenants file's
`webhook_secret`), else the shared WEBHOOK_SECRET (`whsec_<base64>`): `webhook-id` (the
same on every retry of one event, for the receiver's de-duplication),
`webhook-timestamp` (unix seconds of the attempt) and `webhook-signature` (`v1,<base64
HMAC-SHA256 of "id.timestamp.body">`). A receiver checks them with
`Webhook(secret).verify(body, headers)`. With the shared secret every tenant's receiver
holds the key that signs every other tenant's events: it is a fallback for one-tenant
runners, and docs/security.md says so.

Where a delivery may go is the outbound policy's (runner/jobs/outbound.py): each attempt
resolves and checks the URL again and connects to the checked address. Any 2xx is a
delivery; anything else is retried after the `backoff_delays` schedule, and every attempt
is handed to the caller to record with a short code, never the error's text (a tenant
must not learn its way around the network from it): `connection_failed`, `timeout`
(each attempt has one deadline, connect to answer), `http_<status>`,
`address_not_allowed`. Redirects are not followed. The HTTP client and the `sleep` are
injected: tests pass a local server or `httpx.MockTransport`, and a `sleep` that returns at
once. httpx's exceptions are translated here only.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
import orjson
from standardwebhooks import Webhook

from runner.errors import ConfigError
from runner.jobs.outbound import (
    WEBHOOK_URL_MAX,
    AddressNotAllowed,
    OutboundPolicy,
    validate_webhook_url,
)
from runner.jobs.record import Delivery, Job
from runner.telemetry import tracing

__all__ = [
    "WEBHOOK_URL_MAX",
    "RetryPolicy",
    "WebhookSender",
    "backoff_delays",
    "event_body",
    "load_secret",
    "message_id",
    "signed_headers",
    "validate_webhook_url",
]

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]
OnAttempt = Callable[[Delivery], Awaitable[None]]

SECRET_PREFIX = "whsec_"


def load_secret(secret: str, setting: str = "WEBHOOK_SECRET") -> Webhook:
    """The library's signer for `whsec_<base64>`; ConfigError naming `setting` when unusable.

    The Standard Webhooks specification asks for 24 to 64 random bytes.
    """
    if not secret.startswith(SECRET_PREFIX):
        raise ConfigError(f"{setting} must have the form whsec_<base64 of 24-64 random bytes>")
    try:
        raw = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{setting} is not valid base64 after 'whsec_'") from None
    if not 24 <= len(raw) <= 64:
        raise ConfigError(f"{setting} must hold 24 to 64 bytes, not {len(raw)}")
    return Webhook(secret)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """`attempts` tries in all; the wait before try n+1 is base_s * factor**(n-1), capped."""

    attempts: int = 5
    base_s: float = 1.0
    factor: float = 2.0
    cap_s: float = 60.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.base_s < 0 or self.factor < 1 or self.cap_s < 0:
            raise ValueError("RetryPolicy: attempts >= 1, base_s >= 0, factor >= 1, cap_s >= 0")


def backoff_delays(policy: RetryPolicy) -> tuple[float, ...]:
    """Seconds to wait after each failed attempt but the last: (1, 2, 4, 8) by default."""
    return tuple(
        min(policy.cap_s, policy.base_s * policy.factor**n) for n in range(policy.attempts - 1)
    )


def message_id(job: Job) -> str:
    """The event's `webhook-id`: one per job (a job finishes once), the same on every retry."""
    return "msg_" + job.id.removeprefix("job_")


def event_body(job: Job) -> bytes:
    """The JSON posted for a finished job: its type, when it finished, and the GET body."""
    finished = job.finished_at if job.finished_at is not None else job.updated_at
    stamp = datetime.fromtimestamp(finished, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return orjson.dumps(
        {
            "type": f"job.{job.status.value}",
            "timestamp": stamp,
            "data": job.to_json(deliveries=False),
        }
    )


def signed_headers(signer: Webhook, msg_id: str, timestamp: float, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers for `body` sent at `timestamp` (unix seconds)."""
    moment = datetime.fromtimestamp(int(timestamp), tz=UTC)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(timestamp)),
        "webhook-signature": signer.sign(msg_id, moment, body.decode()),
    }


class WebhookSender:
    """Posts signed events with an injected httpx client; never raises for a failed delivery.

    `secret` is the shared fallback (WEBHOOK_SECRET, may be None), `secrets` the tenants'
    own; `policy` says where a delivery may go (default: public addresses only)."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        secret: str | None,
        *,
        secrets: Mapping[str, str] | None = None,
        policy: OutboundPolicy | None = None,
        clock: Clock = time.time,
        sleep: Sleep = asyncio.sleep,
        retry: RetryPolicy | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self._client = client
        self._shared = load_secret(secret) if secret is not None else None
        self._own = {t: load_secret(s) for t, s in (secrets or {}).items()}
        self.policy = policy or OutboundPolicy()
        self._clock = clock
        self._sleep = sleep
        self.retry = retry or RetryPolicy()
        self._timeout_s = timeout_s
        self._timeout = httpx.Timeout(timeout_s)

    def signs_for(self, tenant: str | None) -> bool:
        """Whether an event of `tenant` can be signed (its own secret, or the shared one)."""
        return self._signer(tenant) is not None

    def _signer(self, tenant: str | None) -> Webhook | None:
        own = self._own.get(tenant) if tenant is not None else None
        return own or self._shared

    async def attempt(
        self, url: str, msg_id: str, body: bytes, number: int, tenant: str | None = None
    ) -> Delivery:
        """One signed POST to the checked address within the attempt's deadline; the
        receiver's status code, or a short error code, as a Delivery."""
        at = self._clock()
        signer = self._signer(tenant)
        if signer is None:
            return Delivery(number, at, error="no_secret")
        try:
            target = await self.policy.pin(url)
        except AddressNotAllowed:
            return Delivery(number, at, error="address_not_allowed")
        except (OSError, ValueError):
            return Delivery(number, at, error="connection_failed")
        port = (
            ""
            if target.port == (443 if url.lower().startswith("https") else 80)
            else f":{target.port}"
        )
        headers = {
            "host": target.host + port,
            "content-type": "application/json",
            "user-agent": "quorum-runner",
            **signed_headers(signer, msg_id, at, body),
        }
        tracing.inject(headers)  # the job's trace goes on (tracing on: `traceparent`)
        try:
            async with asyncio.timeout(self._timeout_s):
                async with self._client.stream(
                    "POST",
                    target.pinned_url,
                    content=body,
                    headers=headers,
                    timeout=self._timeout,
                    extensions={"sni_hostname": target.host},
                ) as response:  # the receiver's body is never read
                    status = response.status_code
        except (TimeoutError, httpx.TimeoutException):
            return Delivery(number, at, error="timeout")
        except (httpx.HTTPError, httpx.InvalidURL, OSError):
            return Delivery(number, at, error="connection_failed")
        if 200 <= status < 300:
            return Delivery(number, at, status_code=status)
        return Delivery(number, at, status_code=status, error=f"http_{status}")

    async def deliver(
        self,
        url: str,
        msg_id: str,
        body: bytes,
        on_attempt: OnAttempt,
        tenant: str | None = None,
    ) -> bool:
        """Attempt until one answers 2xx or the policy's attempts are spent; True if delivered.

        Each attempt is given to `on_attempt` before the wait that may follow it.
        """
        delays = backoff_delays(self.retry)
        for number in range(1, self.retry.attempts + 1):
            attributes: tracing.Attributes = {
                "http.request.method": "POST",
                "quorum.webhook.attempt": number,
            }
            with tracing.span("POST webhook", attributes, tracing.CLIENT) as span:
                delivery = await self.attempt(url, msg_id, body, number, tenant)
                if delivery.status_code is not None:
                    span.set_attribute("http.response.status_code", delivery.status_code)
                if delivery.error is not None:
                    tracing.failed(span, delivery.error)
            await on_attempt(delivery)
            if delivery.ok:
                return True
            if number <= len(delays):
                await self._sleep(delays[number - 1])
        return False
