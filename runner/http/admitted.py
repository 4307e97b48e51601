"""A request path's admission scope for one call (step 5 of runner/http/frontend.py): the
job scope (`runner.scheduler.grants.Hold`: the scheduler's grant, given back with the
engine's usage or once the engine let the request go) plus a disconnect watch."""

from __future__ import annotations

import asyncio
from types import TracebackType

from runner.http.asgi import ClientGone, DisconnectWatch
from runner.http.call import ClientCall
from runner.scheduler.grants import Admission, AdmissionRequest, Hold, Served


class Admitted(Hold):
    """`Hold` under a disconnect scope, for one call.

    Entering starts watching the client (the body must have been read: the watch takes
    `receive`; the watch its token budget's wait started, when it waited), then waits for
    the scheduler's grant as `Hold` does; leaving gives the grant back as `Hold` does. A
    client that goes away meanwhile cancels the task: `ClientGone` comes out of the block,
    once. `disarm()` once the answer's last byte is about to leave.
    """

    __slots__ = ("_call", "_watch")

    def __init__(
        self, admission: Admission, metrics: Served, call: ClientCall, request: AdmissionRequest
    ) -> None:
        super().__init__(admission, request, metrics=metrics)
        self._call = call
        if call.watch is not None:  # it waited for its token budget under this watch
            self._watch = call.watch
        else:
            task = asyncio.current_task()
            assert task is not None
            self._watch = DisconnectWatch(task)

    def disarm(self) -> None:
        self._watch.disarm()

    async def __aenter__(self) -> Admitted:
        self._watch.start(self._call.scope, self._call.receive)
        try:
            await super().__aenter__()
        except asyncio.CancelledError:
            self._gone()
            raise
        except BaseException:
            self._watch.disarm()
            raise
        self._call.grant = self.grant
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._watch.disarm()
        await super().__aexit__(kind, exc, tb)
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
