"""Shared kit for the job tests: a movable clock, record builders, a real webhook receiver."""

from __future__ import annotations

import base64
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from standardwebhooks import Webhook, WebhookVerificationError

from runner.jobs import record
from runner.jobs.record import Job

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z
SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
OTHER_SECRET = "whsec_" + base64.b64encode(bytes(range(1, 33))).decode()


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def queued(
    job_id: str = "job_one",
    tenant: str = "acme",
    runner_id: str = "runner-a",
    now: float = NOW,
    webhook: str | None = None,
) -> Job:
    return record.new_job(
        job_id, "transcription", tenant, "whisper-tiny.en", runner_id, now, webhook
    )


def running(job_id: str = "job_one", runner_id: str = "runner-a", now: float = NOW) -> Job:
    return record.start(queued(job_id, runner_id=runner_id, now=now), now + 1)


@dataclass
class Received:
    """One POST the receiver got, and what the library's verification made of it."""

    headers: dict[str, str]
    body: bytes
    payload: Any = None
    error: str | None = None


@dataclass
class Receiver:
    """A webhook endpoint on 127.0.0.1 that verifies every POST with `standardwebhooks`."""

    secret: str
    statuses: list[int] = field(default_factory=list)  # answers in order, then 200
    received: list[Received] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        got = Received(dict(request.headers), body)
        try:
            got.payload = Webhook(self.secret).verify(body, got.headers)
        except WebhookVerificationError as exc:
            got.error = str(exc)
        self.received.append(got)
        status = self.statuses.pop(0) if self.statuses else 200
        if got.error is not None:
            status = 401
        return web.Response(status=status)

    @property
    def verified(self) -> list[Any]:
        return [r.payload for r in self.received if r.error is None]


@asynccontextmanager
async def receiver(
    secret: str = SECRET, statuses: list[int] | None = None
) -> AsyncIterator[Receiver]:
    """A real HTTP server on a free loopback port, stopped on exit."""
    hook = Receiver(secret, list(statuses or []))
    app = web.Application()
    app.router.add_post("/hook", hook.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    await web.SockSite(runner, sock).start()
    hook.url = f"http://127.0.0.1:{port}/hook"
    try:
        yield hook
    finally:
        await runner.cleanup()
        sock.close()
