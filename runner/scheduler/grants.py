"""The seam between the data path and scheduling.

The data path asks an `Admission` for a `Grant` before it forwards a request to
an engine, and gives the grant back when the engine is done. The scheduler
(`runner/scheduler/admission.py`, `SchedulerAdmission`) implements it with queues,
priorities and fair sharing; the data path knows only this protocol.

Contract:
- `acquire` returns a grant, or raises a `runner.errors.QuorumError` subclass
  (queue full, queue timeout) that the error map turns into a response.
- If the coroutine awaiting `acquire` is cancelled (the client went away while
  queued), the request is withdrawn and never reaches the engine.
- `release` is called exactly once per grant, with the usage the engine
  reported when it is known.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """What scheduling needs to know about one inference request."""

    request_id: str
    model: str
    tenant: str
    priority: str  # "high" | "normal" | "low"
    est_input_tokens: int
    est_output_tokens: int
    deadline_ms: int | None = None  # how long the client waits for the first byte


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens the engine reported for a finished request."""

    input_tokens: int
    output_tokens: int


@dataclass(slots=True)
class Grant:
    """Permission to send one request to the engine; `queue_wait_ms` is measured."""

    request: AdmissionRequest
    queue_wait_ms: int = 0


class Admission(Protocol):
    async def acquire(self, request: AdmissionRequest) -> Grant: ...

    def release(self, grant: Grant, usage: Usage | None) -> None: ...

    def queue_depth(self) -> int: ...


class Holding(Protocol):
    """A request holding its grant inside an admission scope (`Hold`, or the front-end's
    `Admitted`); `usage` set inside the scope is given back with the grant."""

    grant: Grant | None
    usage: Usage | None


class Served(Protocol):
    """The metrics of requests at the engine (in flight, and how long)."""

    def begin_request(self, model: str) -> None: ...

    def end_request(self, model: str, seconds: float) -> None: ...


class Hold:
    """`async with Hold(admission, request) as held:` acquire, then release with
    `held.usage`, however the block ends (async jobs: no client to watch)."""

    __slots__ = ("_admission", "_metrics", "_request", "_started", "grant", "usage")

    def __init__(
        self, admission: Admission, request: AdmissionRequest, *, metrics: Served | None = None
    ) -> None:
        self._admission = admission
        self._request = request
        self._metrics = metrics
        self._started = 0.0
        self.grant: Grant | None = None
        self.usage: Usage | None = None

    async def __aenter__(self) -> Hold:
        self.grant = await self._admission.acquire(self._request)
        self._started = time.perf_counter()
        if self._metrics is not None:
            self._metrics.begin_request(self._request.model)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.grant is not None:
            if self._metrics is not None:
                elapsed = time.perf_counter() - self._started
                self._metrics.end_request(self._request.model, elapsed)
            self._admission.release(self.grant, self.usage)


Admit = Callable[[AdmissionRequest], AbstractAsyncContextManager[Holding]]
"""An admission scope for one request: the request path's (`runner.http.frontend.Admitted`,
which also watches the client) or a job's (`Hold`)."""
