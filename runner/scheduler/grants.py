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
- The slot is the engine's until the engine has let the request go, not until its
  caller is done with it: where a cancel (client gone, job deleted) does not stop the
  engine's work at once (ComfyUI finishes its running node; the speech worker its
  segment), the work hands its scope the engine's let-go (`release_when`) and the grant
  is released when that completes (`give_back`). Meanwhile the slot stays taken, so the
  next request waits in the runner's queue, counted in its `X-Queue-Wait-Ms`, never
  inside the engine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

from faults.record import record


@record
class AdmissionRequest:
    """What scheduling needs to know about one inference request."""

    request_id: str
    model: str
    tenant: str
    priority: str  # "high" | "normal" | "low"
    est_input_tokens: int
    est_output_tokens: int
    deadline_ms: int | None = None  # how long the client waits for the first byte
    work: float | None = None  # engine work it states (images: megapixel-steps), timed
    # by the model's fit of seconds against work (scheduler/work_fit.py)


@record
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

    def progress(self, grant: Grant, done: float) -> None:
        """The engine's progress (0..1) on a granted request, for the wait forecast."""
        ...

    def queue_depth(self) -> int: ...


class Holding(Protocol):
    """A request holding its grant inside an admission scope (`Hold`, or the front-end's
    `Admitted`); `usage` set inside the scope is given back with the grant."""

    grant: Grant | None
    usage: Usage | None

    def release_when(self, let_go: Awaitable[object]) -> None:
        """The engine still works on the request after the scope ends: give the slot
        back once `let_go` completes (it must be bounded), not at the scope's end."""
        ...

    def progress(self, done: float) -> None:
        """The engine's progress on the request (0..1): what it has left is forecast
        from it (`Admission.progress`)."""
        ...


log = logging.getLogger("quorum.scheduler")
_LETTING_GO: set[asyncio.Future[object]] = set()


def give_back(
    admission: Admission,
    grant: Grant,
    usage: Usage | None,
    let_go: asyncio.Future[object] | None = None,
) -> None:
    """Release `grant` now, or, when the engine has not let the request go yet, once
    `let_go` completes (however it ends: a failed or cancelled wait releases too)."""
    if let_go is None:  # the common case: no callback to build
        admission.release(grant, usage)
        return

    def release(done: asyncio.Future[object] | None) -> None:
        if done is not None:
            _LETTING_GO.discard(done)
            if not done.cancelled() and done.exception() is not None:
                log.warning("waiting for an engine to let go failed: %r", done.exception())
        admission.release(grant, usage)

    if let_go is None or let_go.done():
        release(let_go)
        return
    _LETTING_GO.add(let_go)
    let_go.add_done_callback(release)


def let_go_of(awaitable: Awaitable[object]) -> asyncio.Future[object]:
    """`awaitable` as a future running from now on (a coroutine becomes a task)."""
    return asyncio.ensure_future(awaitable)


class Served(Protocol):
    """The metrics of requests at the engine (in flight, and how long)."""

    def begin_request(self, model: str) -> None: ...

    def end_request(self, model: str, seconds: float) -> None: ...


class Hold:
    """`async with Hold(admission, request) as held:` acquire, then release with
    `held.usage`, however the block ends: the one admission scope (an async job's as it
    is; a request path's with a disconnect watch around it, `runner.http.admitted`)."""

    __slots__ = ("_admission", "_let_go", "_metrics", "_request", "_started", "grant", "usage")

    def __init__(
        self, admission: Admission, request: AdmissionRequest, *, metrics: Served | None = None
    ) -> None:
        self._admission = admission
        self._request = request
        self._metrics = metrics
        self._started = 0.0
        self.grant: Grant | None = None
        self.usage: Usage | None = None
        self._let_go: asyncio.Future[object] | None = None

    def release_when(self, let_go: Awaitable[object]) -> None:
        self._let_go = let_go_of(let_go)

    def progress(self, done: float) -> None:
        if self.grant is not None:
            self._admission.progress(self.grant, done)

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
            give_back(self._admission, self.grant, self.usage, self._let_go)


Admit = Callable[[AdmissionRequest], AbstractAsyncContextManager[Holding]]
"""An admission scope for one request: a job's (`Hold`) or the request path's
(`runner.http.admitted.Admitted`: `Hold` plus a disconnect watch)."""
