"""The front-end's admission scope for one call (`FrontEnd.admitted`, step 4 of
runner/http/frontend.py): the scheduler's grant under a disconnect watch."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from types import TracebackType
from typing import TYPE_CHECKING

from runner.http.asgi import ClientGone, DisconnectWatch
from runner.scheduler.grants import AdmissionRequest, Grant, Usage, give_back, let_go_of

if TYPE_CHECKING:
    from runner.http.frontend import ClientCall, FrontEnd


class Admitted:
    """Admission under a disconnect scope, for one call.

    Entering starts watching the client (the body must have been read: the watch takes
    `receive`), then waits for the scheduler's grant; leaving gives the grant back with
    `usage` (set it inside the block), or, where the engine goes on with the request
    after a cancel (`release_when`), once the engine let it go. A client that goes away
    meanwhile cancels the task: `ClientGone` comes out of the block, once. `disarm()`
    once the answer's last byte is about to leave.
    """

    __slots__ = (
        "_call",
        "_front",
        "_let_go",
        "_request",
        "_started",
        "_watch",
        "grant",
        "usage",
    )

    def __init__(self, front: FrontEnd, call: ClientCall, request: AdmissionRequest) -> None:
        self._front = front
        self._call = call
        self._request = request
        self._started = 0.0
        self.grant: Grant | None = None
        self.usage: Usage | None = None
        self._let_go: asyncio.Future[object] | None = None
        if call.watch is not None:  # it waited for its token budget under this watch
            self._watch = call.watch
        else:
            task = asyncio.current_task()
            assert task is not None
            self._watch = DisconnectWatch(task)

    def disarm(self) -> None:
        self._watch.disarm()

    def progress(self, done: float) -> None:
        """The engine's progress on the request (0..1), for the wait forecast."""
        if self.grant is not None:
            self._front.admission.progress(self.grant, done)

    def release_when(self, let_go: Awaitable[object]) -> None:
        """The engine goes on with the request after this block (`grants.Holding`)."""
        self._let_go = let_go_of(let_go)

    async def __aenter__(self) -> Admitted:
        self._watch.start(self._call.scope, self._call.receive)
        try:
            self.grant = self._call.grant = await self._front.admission.acquire(self._request)
        except asyncio.CancelledError:
            self._gone()
            raise
        except BaseException:
            self._watch.disarm()
            raise
        self._started = time.perf_counter()
        self._front.metrics.begin_request(self._request.model)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._watch.disarm()
        front = self._front
        if self.grant is not None:
            front.metrics.end_request(self._request.model, time.perf_counter() - self._started)
            give_back(front.admission, self.grant, self.usage, self._let_go)
        if kind is asyncio.CancelledError:
            self._gone()

    def _gone(self) -> None:
        """A cancellation that the client's going away caused becomes `ClientGone`."""
        if not self._watch.gone:
            return
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        raise ClientGone from None
