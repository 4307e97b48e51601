"""Webhooks: signed with the Standard Webhooks scheme, retried with capped exponential backoff.

A finished job's event is posted to its `webhook` URL as JSON::

    {"type": "job.succeeded", "timestamp": "2026-01-01T00:00:00Z", "data": <GET body>}

with the three headers of the Standard Webhooks specification, made by the
`standardwebhooks` library from the shared secret (`whsec_<base64>`):
`webhook-id` (the same on every retry of one event, for the receiver's
de-duplication), `webhook-timestamp` (unix seconds of the attempt) and
`webhook-signature` (`v1,<base64 HMAC-SHA256 of "id.timestamp.body">`). A
receiver checks them with `Webhook(secret).verify(body, headers)`.

Any 2xx is a delivery; anything else (another status, a refused connection, a
timeout) is retried after the `backoff_delays` schedule, and every attempt is
handed to the caller to record. Redirects are not followed. The HTTP client
and the `sleep` are injected: tests pass a local server or `httpx.MockTransport`,
and a `sleep` that returns at once. httpx's exceptions are translated here only.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlsplit

import httpx
import orjson
from standardwebhooks import Webhook

from runner.errors import ConfigError
from runner.jobs.errors import InvalidWebhook
from runner.jobs.record import Delivery, Job

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]
OnAttempt = Callable[[Delivery], Awaitable[None]]

WEBHOOK_URL_MAX = 2048
SECRET_PREFIX = "whsec_"


def validate_webhook_url(url: str) -> str:
    """The URL as given when a job may post to it; InvalidWebhook (400) saying why otherwise.

    1. At most WEBHOOK_URL_MAX characters, no spaces or control characters.
    2. The scheme is http or https.
    3. It names a host (and a valid port, if any).
    4. It carries no user name or password (they would be stored and shown with the job).
    """
    if len(url) > WEBHOOK_URL_MAX:  # 1.
        raise InvalidWebhook(f"webhook URL is longer than {WEBHOOK_URL_MAX} characters")
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        raise InvalidWebhook("webhook URL contains spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError when out of range or not a number
    except ValueError as exc:
        raise InvalidWebhook(f"webhook URL is malformed: {exc}") from None
    if parts.scheme.lower() not in ("http", "https"):  # 2.
        raise InvalidWebhook(
            f"webhook URL must use http or https, not {parts.scheme or 'no scheme'!r}"
        )
    if not parts.hostname or port == 0:  # 3.
        raise InvalidWebhook("webhook URL names no host")
    if parts.username is not None or parts.password is not None:  # 4.
        raise InvalidWebhook("webhook URL must not carry a user name or password")
    return url


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
    """Posts signed events with an injected httpx client; never raises for a failed delivery."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        secret: str,
        *,
        clock: Clock = time.time,
        sleep: Sleep = asyncio.sleep,
        policy: RetryPolicy | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self._client = client
        self._signer = load_secret(secret)
        self._clock = clock
        self._sleep = sleep
        self.policy = policy or RetryPolicy()
        self._timeout = httpx.Timeout(timeout_s)

    async def attempt(self, url: str, msg_id: str, body: bytes, number: int) -> Delivery:
        """One signed POST; the receiver's status code, or the error, as a Delivery."""
        at = self._clock()
        headers = {
            "content-type": "application/json",
            "user-agent": "quorum-runner",
            **signed_headers(self._signer, msg_id, at, body),
        }
        try:
            async with self._client.stream(
                "POST", url, content=body, headers=headers, timeout=self._timeout
            ) as response:  # the receiver's body is never read
                return Delivery(number, at, status_code=response.status_code)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return Delivery(number, at, error=text[:300])

    async def deliver(self, url: str, msg_id: str, body: bytes, on_attempt: OnAttempt) -> bool:
        """Attempt until one answers 2xx or the policy's attempts are spent; True if delivered.

        Each attempt is given to `on_attempt` before the wait that may follow it.
        """
        delays = backoff_delays(self.policy)
        for number in range(1, self.policy.attempts + 1):
            delivery = await self.attempt(url, msg_id, body, number)
            await on_attempt(delivery)
            if delivery.ok:
                return True
            if number <= len(delays):
                await self._sleep(delays[number - 1])
        return False
