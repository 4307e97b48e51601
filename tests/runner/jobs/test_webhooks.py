"""Webhooks: URL checks, the secret, the backoff schedule, signed delivery to a real receiver."""

from __future__ import annotations

import base64
import os
import time

import httpx
import orjson
import pytest
from standardwebhooks import Webhook

from runner.errors import ConfigError
from runner.jobs import record
from runner.jobs.errors import InvalidWebhook
from runner.jobs.outbound import AllowList, OutboundPolicy
from runner.jobs.record import Delivery
from runner.jobs.webhooks import (
    RetryPolicy,
    WebhookSender,
    backoff_delays,
    event_body,
    load_secret,
    message_id,
    signed_headers,
    validate_webhook_url,
)
from tests.runner.jobs.support import OTHER_SECRET, SECRET, Clock, receiver, running
from tests.support.ports import free_port


class Sleeps:
    """An injected sleep that records the waits and returns at once."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.mark.parametrize(
    "url",
    ["http://hooks.example.test/x", "https://10.0.0.5:8443/a?b=c", "HTTPS://h.test"],
)
def test_webhooks_url_accepted(url: str) -> None:
    """http and https URLs with a host are accepted as given."""
    assert validate_webhook_url(url) == url


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://h.test/x", "http or https"),
        ("file:///etc/passwd", "http or https"),
        ("javascript:alert(1)", "http or https"),
        ("h.test/x", "http or https"),
        ("http:///x", "no host"),
        ("http://h.test:99999/x", "malformed"),
        ("http://user:pw@h.test/x", "user name"),
        ("http://h.test/a b", "spaces"),
        ("http://h.test/\n", "spaces"),
        ("https://h.test/" + "a" * 2100, "longer"),
    ],
)
def test_webhooks_url_refused(url: str, why: str) -> None:
    """Anything but an http(s) URL with a host and no credentials is a 400 saying why."""
    with pytest.raises(InvalidWebhook) as caught:
        validate_webhook_url(url)
    assert why in str(caught.value) and caught.value.status == 400


def test_webhooks_secret_forms() -> None:
    """whsec_ and 24-64 base64 bytes load; other forms are a ConfigError naming the setting."""
    assert isinstance(load_secret(SECRET), Webhook)
    assert isinstance(load_secret("whsec_" + base64.b64encode(os.urandom(64)).decode()), Webhook)
    for bad in ("plain-secret", "whsec_", "whsec_!!notbase64!!", "whsec_c2hvcnQ="):
        with pytest.raises(ConfigError, match="WEBHOOK_SECRET"):
            load_secret(bad)


def test_webhooks_backoff_schedule() -> None:
    """Default: 5 attempts, waits 1, 2, 4, 8 s; the cap bounds long schedules."""
    assert backoff_delays(RetryPolicy()) == (1.0, 2.0, 4.0, 8.0)
    assert backoff_delays(RetryPolicy(attempts=8, base_s=5, cap_s=30)) == (
        5.0,
        10.0,
        20.0,
        30.0,
        30.0,
        30.0,
        30.0,
    )
    assert backoff_delays(RetryPolicy(attempts=1)) == ()
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)


def test_webhooks_signature_verifies_with_the_library() -> None:
    """Headers made by signed_headers verify with `Webhook(secret).verify` and the body."""
    body = b'{"type":"job.succeeded","data":{"text":"\xc3\xa9t\xc3\xa9"}}'
    headers = signed_headers(load_secret(SECRET), "msg_1", time.time(), body)
    assert set(headers) == {"webhook-id", "webhook-timestamp", "webhook-signature"}
    assert headers["webhook-signature"].startswith("v1,")
    assert Webhook(SECRET).verify(body, headers)["data"]["text"] == "été"


def test_webhooks_event_body() -> None:
    """The event names the final status, when it happened, and carries the GET body."""
    job = record.succeed(running(), {"text": "hi"}, 1_767_225_660.0)
    event = orjson.loads(event_body(job))
    assert event["type"] == "job.succeeded"
    assert event["timestamp"] == "2026-01-01T00:01:00Z"
    assert event["data"] == job.to_json(deliveries=False)
    assert message_id(job) == "msg_one"


async def test_webhooks_delivered_to_a_real_server_that_verifies() -> None:
    """A real receiver on 127.0.0.1 verifies the signature; a 503 first is retried after 1 s."""
    sleeps = Sleeps()
    attempts: list[Delivery] = []

    async def on_attempt(delivery: Delivery) -> None:
        attempts.append(delivery)

    async with receiver(SECRET, statuses=[503]) as hook, httpx.AsyncClient() as client:
        sender = WebhookSender(client, SECRET, clock=time.time, sleep=sleeps, policy=LOOPBACK)
        body = event_body(record.succeed(running(), {"text": "hello"}, time.time()))
        assert await sender.deliver(hook.url, "msg_one", body, on_attempt)

    assert [d.status_code for d in attempts] == [503, 200]
    assert [d.attempt for d in attempts] == [1, 2]
    assert sleeps.waits == [1.0]
    assert len(hook.verified) == 2 and all(r.error is None for r in hook.received)
    assert hook.verified[1]["data"]["result"] == {"text": "hello"}
    assert {r.headers["webhook-id"] for r in hook.received} == {"msg_one"}


async def test_webhooks_wrong_secret_fails_verification() -> None:
    """A receiver holding another secret rejects the signature (the test server answers 401)."""
    async with receiver(OTHER_SECRET) as hook, httpx.AsyncClient() as client:
        sender = WebhookSender(
            client, SECRET, sleep=Sleeps(), retry=RetryPolicy(attempts=1), policy=LOOPBACK
        )
        assert not await sender.deliver(hook.url, "msg_x", b"{}", _ignore)
    assert hook.received[0].error == "No matching signature found"


async def test_webhooks_gives_up_after_the_policy(unused_port: int) -> None:
    """A receiver that never answers gets 5 attempts, each recorded with a short error code
    (never the error's text: it would tell a tenant how the network answered)."""
    attempts: list[Delivery] = []

    async def on_attempt(delivery: Delivery) -> None:
        attempts.append(delivery)

    sleeps = Sleeps()
    clock = Clock()
    async with httpx.AsyncClient() as client:
        sender = WebhookSender(client, SECRET, clock=clock, sleep=sleeps, policy=LOOPBACK)
        delivered = await sender.deliver(
            f"http://127.0.0.1:{unused_port}/hook", "msg_1", b"{}", on_attempt
        )
    assert not delivered
    assert [d.attempt for d in attempts] == [1, 2, 3, 4, 5]
    assert all(d.status_code is None and d.error == "connection_failed" for d in attempts)
    assert sleeps.waits == [1.0, 2.0, 4.0, 8.0]


async def test_webhooks_status_codes_with_mock_transport() -> None:
    """Through a MockTransport: 2xx ends the delivery, 3xx/4xx/5xx are retried (`http_<status>`),
    none followed; the request goes to the address the policy checked, the name in Host."""
    answers = [302, 410, 500, 204]
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(answers.pop(0), headers={"location": "http://elsewhere.test/"})

    attempts: list[Delivery] = []

    async def on_attempt(delivery: Delivery) -> None:
        attempts.append(delivery)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        sender = WebhookSender(client, SECRET, clock=Clock(), sleep=Sleeps(), policy=PUBLIC)
        assert await sender.deliver("https://h.test/hook", "msg_1", b'{"a":1}', on_attempt)
    assert [d.status_code for d in attempts] == [302, 410, 500, 204]
    assert [d.error for d in attempts] == ["http_302", "http_410", "http_500", None]
    assert {str(r.url) for r in seen} == {"https://93.184.216.34/hook"}
    assert {r.headers["host"] for r in seen} == {"h.test"}
    assert {r.extensions["sni_hostname"] for r in seen} == {"h.test"}
    assert seen[0].headers["content-type"] == "application/json"
    assert seen[0].content == b'{"a":1}'


async def _public(host: str, port: int) -> list[str]:
    return ["93.184.216.34"]


LOOPBACK = OutboundPolicy(allow=AllowList.parse("127.0.0.1/32"))
"""The test receivers listen on loopback, which the operator's allow-list must admit."""
PUBLIC = OutboundPolicy(resolve=_public)


async def _ignore(_: Delivery) -> None:
    return None


@pytest.fixture
def unused_port() -> int:
    return free_port()
