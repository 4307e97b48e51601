"""One request's answer as the runner reads it: Info, then Segments, then Done.

The engine delivers the worker's messages (or the error that ends the request) with
`deliver`; the reader takes them with `wait_info()` and `async for`. See engine.py.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Protocol

from adapters.errors import EngineBadResponse, EngineError
from adapters.speech import Info, Segment
from adapters.whisper.errors import worker_error
from adapters.whisper.messages import Done

Item = Info | Segment | Done | BaseException


class Owner(Protocol):
    """What a transcription needs from its engine."""

    @property
    def closed(self) -> bool: ...

    @property
    def silence_s(self) -> float | None: ...

    def cancel(self, request_id: str) -> None: ...

    def forget(self, request_id: str) -> None: ...

    async def silent(self, request_id: str) -> EngineError: ...


class Transcription:
    """One request's answer: `wait_info()`, then its segments by `async for`, then `done`.

    A failed request raises from `wait_info()` or the iteration: the worker's refusal
    (`InvalidAudio`, ...), `TranscriptionFailed`, `EngineCrashed` when the worker died, or
    `EngineSilent` when it sent nothing for the engine's `silence_s` (and was killed).
    Closed early, it stays in the engine's `in_flight` until the worker's `Done` arrives
    (then in `done`, `error_code` "cancelled"): the worker's slot is busy until then, and
    `let_go()` returns then (the runner keeps the request's slot until it does).
    """

    def __init__(self, engine: Owner, request_id: str) -> None:
        self.engine = engine
        self.request_id = request_id
        self.info: Info | None = None
        self.done: Done | None = None
        self.seconds_done = 0.0
        self._queue: asyncio.Queue[Item] = asyncio.Queue()
        self._closed = False
        self._settled = asyncio.Event()  # nothing more will come from the worker for it

    def deliver(self, item: Item) -> None:
        """From the engine: the next message, or the error that ends the request."""
        if not self._closed:
            self._queue.put_nowait(item)
            return
        if isinstance(item, Done):  # a closed request's answer: its slot is free now
            self.done = item
        if isinstance(item, Done | BaseException):
            self.engine.forget(self.request_id)
            self._settled.set()

    async def _next(self) -> Info | Segment | Done:
        """The worker's next message; nothing within the engine's `silence_s`: the request
        ends with the engine's `silent` error (504), its worker killed."""
        try:
            async with asyncio.timeout(self.engine.silence_s):
                item = await self._queue.get()
        except TimeoutError:
            self._finish()
            raise await self.engine.silent(self.request_id) from None
        if isinstance(item, BaseException):
            self._finish()
            raise item
        if isinstance(item, Done):
            self.done = item
            self._finish()
            if item.error is not None:
                raise worker_error(item.error_code, item.error)
        return item

    async def wait_info(self) -> Info:
        """The audio's duration and language (the worker decoded it)."""
        if self.info is None:
            item = await self._next()
            if not isinstance(item, Info):
                raise EngineBadResponse("speech worker answered before it sent Info")
            self.info = item
        return self.info

    def __aiter__(self) -> Transcription:
        return self

    async def __anext__(self) -> Segment:
        if self.info is None:
            await self.wait_info()
        if self.done is not None:
            raise StopAsyncIteration
        item = await self._next()
        if isinstance(item, Segment):
            self.seconds_done = item.end
            return item
        if isinstance(item, Done):
            if self.info is not None:
                self.seconds_done = self.info.duration
            raise StopAsyncIteration
        raise EngineBadResponse("speech worker sent Info twice")

    def _finish(self) -> None:
        """Answered (Done or an error): nothing more will come for this request."""
        self._closed = True
        self.engine.forget(self.request_id)
        self._settled.set()

    @property
    def settled(self) -> bool:
        """The worker is done with this request (answered, or it cannot answer any more)."""
        return self._settled.is_set()

    async def let_go(self) -> None:
        """Return once the worker is done with this request: after an early close, when its
        `Done` comes (it stops at its next segment) or the engine fails. A worker that
        sends nothing for the engine's `silence_s` meanwhile is stuck, and is killed as a
        silent request's is (`silent`)."""
        try:
            async with asyncio.timeout(self.engine.silence_s):
                await self._settled.wait()
        except TimeoutError:
            await self.engine.silent(self.request_id)
            self._settled.set()

    async def aclose(self) -> None:
        """Stop the request if the worker is still on it; its Done is awaited by no one
        (but `let_go`)."""
        if self._closed:
            return
        self._closed = True
        self.engine.cancel(self.request_id)
        if self.engine.closed:
            self.engine.forget(self.request_id)
            self._settled.set()

    async def __aenter__(self) -> Transcription:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
