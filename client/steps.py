"""The client's flows are written once, as generators, and run by two drivers.

A flow (`Flow[T]`) yields steps and gets their outcomes back, and returns its result:

    Call(method, url, ...)  ──▶  Reply(status, headers, content) | NoReply(reason, sent)
    Calls((call, ...))      ──▶  (Reply | NoReply, ...)   in order; concurrent where it can
    Sleep(seconds)          ──▶  None

`client/transport.py` runs a flow with `httpx.Client` (`drive_sync`) or
`httpx.AsyncClient` (`drive_async`), and `client/facades.py` gives every flow a blocking
and an awaitable method: the decisions (what to ask, when to wait, where to go next) live
in one place and are tested without a network, as httpx's own sans-I/O design and Cog's
message types suggest.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from client.errors import RunnerRefused, RunnerUnreachable
from client.state import parse_retry_after

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Call:
    method: str
    url: str
    json: object = None
    headers: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, tuple[str, bytes, str]] | None = None
    """Multipart files: field name -> (file name, bytes, content type)."""
    data: Mapping[str, str] | None = None
    """Multipart form fields (with `files`)."""
    timeout_s: float | None = None


@dataclass(frozen=True, slots=True)
class Calls:
    """Several calls at once (a pool's capabilities polls): `drive_async` makes them
    concurrently, `drive_sync` one by one; the outcomes come back in their order."""

    calls: tuple[Call, ...]


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class Reply:
    url: str
    status: int
    headers: Mapping[str, str]
    """Header names in lower case."""
    content: bytes

    def json(self) -> Any:
        """The body as JSON; None when it is not JSON."""
        try:
            return json.loads(self.content)
        except ValueError:
            return None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


@dataclass(frozen=True, slots=True)
class NoReply:
    url: str
    reason: str
    sent: bool
    """The request may have reached the runner (a read failed, not the connect)."""


Step = Call | Calls | Sleep
Outcome = Reply | NoReply | tuple[Reply | NoReply, ...] | None
Flow = Generator[Step, Outcome, T]
"""A flow: yields steps, is sent their outcomes, returns its result (a `T`)."""


def refusal(reply: Reply, now_epoch: float) -> RunnerRefused:
    """The runner's error answer as an exception (its envelope's code and message)."""
    body = reply.json()
    code, message = f"http_{reply.status}", reply.content[:200].decode("utf-8", "replace")
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        code = str(error.get("code", code))
        message = str(error.get("message", message))
    return RunnerRefused(
        reply.url,
        reply.status,
        code,
        message,
        retry_after=parse_retry_after(reply.headers.get("retry-after"), now_epoch),
        body=body,
    )


def call(step: Call) -> Flow[Reply]:
    """One call; a failure to get any answer raises RunnerUnreachable."""
    outcome = yield step
    if isinstance(outcome, NoReply):
        raise RunnerUnreachable(outcome.url, outcome.reason)
    assert isinstance(outcome, Reply)
    return outcome


def expect(step: Call, status: int, now_epoch: float) -> Flow[Reply]:
    """One call that must answer `status` (else RunnerRefused)."""
    reply = yield from call(step)
    if reply.status != status:
        raise refusal(reply, now_epoch)
    return reply
