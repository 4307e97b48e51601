"""What the bare-ASGI request paths share (the data path, the audio path, the image path):
the ASGI types, the one bounded body reader (the control plane's too), the watch that
cancels a handler when its client goes away, and the two ways an answer leaves in one
write (a whole body, or the runner's error envelope).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from runner.errors import PayloadTooLarge, error_body, error_headers, error_status

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

JSON = b"application/json"
FALSE_REPORT_HEADERS = [(b"x-cache-hit", b"false"), (b"x-cache-tokens-reused", b"0")]
"""The cache headers of an answer the engine reported nothing for (or an error)."""


class ClientGone(Exception):
    """The client disconnected; nothing more is sent to it (counted as 499)."""


async def read_body(receive: Receive, content_length: int | None, limit: int) -> bytes:
    """The whole body, refused with 413 the moment it passes `limit` (its Content-Length
    first); a client gone meanwhile raises `ClientGone`."""
    if content_length is not None and content_length > limit:
        raise PayloadTooLarge(f"request body is larger than {limit} bytes")
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is larger than {limit} bytes")
        if not message.get("more_body", False):
            if not parts:
                return chunk
            parts.append(chunk)
            return b"".join(parts)
        parts.append(chunk)


GONE_HOOK = "quorum.on_gone"
"""The scope key of the runner's own protocol (runner/http/limits.py): `scope[GONE_HOOK]
(callback)` has `callback()` called once if the connection is lost before
`scope[GONE_HOOK](None)`. Absent under another server (tests' ASGI transports)."""


class DisconnectWatch:
    """Cancels the handler's task if the client disconnects before its answer is complete.

    `start` registers with the connection (`GONE_HOOK`): no task per request. Without
    the hook, a task waits on the ASGI `receive()`, which returns when the client goes
    away or, once the answer is complete, at once. `disarm()` before the last byte makes
    that second case a no-op (cheaper than cancelling the watch: no exception is thrown).
    """

    __slots__ = ("_heard", "_hook", "_listening", "_task", "armed", "gone")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self._task = task
        self._hook: Callable[[Callable[[], None] | None], None] | None = None
        self._listening = False
        self._heard = False  # the disconnect came while disarmed (between two watches)
        self.armed = True
        self.gone = False

    def start(self, scope: Scope, receive: Receive) -> None:
        """Watch (again, after a `disarm`: one watch serves a request's budget wait and
        then its admission; `receive` is read by one task at most)."""
        self.armed = True
        hook = scope.get(GONE_HOOK)
        if hook is not None:
            self._hook = hook
            hook(self.fire)
        elif self._heard:
            self.fire()
        elif not self._listening:
            self._listening = True
            self._task.get_loop().create_task(self.run(receive))

    async def run(self, receive: Receive) -> None:
        message = await receive()
        if message["type"] == "http.disconnect":
            self._heard = True
            self.fire()

    def fire(self) -> None:
        """The client is gone: cancel the handler, unless its answer is out."""
        if self.armed:
            self.gone = True
            self._task.cancel()

    def disarm(self) -> None:
        self.armed = False
        if self._hook is not None:
            self._hook(None)
            self._hook = None


async def send_whole(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], payload: bytes
) -> None:
    """Answer with a complete body (one write, see runner/http/coalesce.py)."""
    headers.append((b"content-length", b"%d" % len(payload)))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


async def send_error(
    send: Send,
    exc: BaseException,
    request_id: str,
    queue_wait_ms: int = 0,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Answer with the error envelope (before any byte of a response was sent)."""
    body = error_body(exc)
    headers = [
        (b"content-type", JSON),
        (b"content-length", b"%d" % len(body)),
        (b"x-request-id", request_id.encode()),
        *FALSE_REPORT_HEADERS,
        (b"x-queue-wait-ms", b"%d" % queue_wait_ms),
        (b"x-gpu-time-ms", b"0"),
    ]
    own = error_headers(exc)
    headers += [(k.lower().encode(), v.encode()) for k, v in own.items()]
    if extra:  # RateLimit-* of this request, unless the error brought its own
        headers += [h for h in extra if h[0].decode().title() not in own]
    await send({"type": "http.response.start", "status": error_status(exc), "headers": headers})
    await send({"type": "http.response.body", "body": body})
