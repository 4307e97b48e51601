"""Driving ASGI handlers in-process: a body fed in chunks, a response recorded."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


def form(
    fields: dict[str, Any], file: bytes | None, filename: str = "speech.wav", part: str = "file"
) -> tuple[bytes, bytes]:
    """A multipart/form-data body and its Content-Type, encoded by httpx (as clients do);
    the audio goes in the part named `part`."""
    files = {part: (filename, file, "application/octet-stream")} if file is not None else None
    request = httpx.Request("POST", "http://runner/", data=fields, files=files)
    return request.read(), request.headers["content-type"].encode()


class Feeder:
    """An ASGI `receive`: the body in `chunk`-byte messages, then a wait for disconnect.

    `pulled` counts the body bytes handed out. `disconnect()` makes the pending (or
    next) call answer `http.disconnect`, as a client going away does.
    """

    def __init__(self, body: bytes, chunk: int = 64 * 1024) -> None:
        self.body = body
        self.chunk = chunk
        self.pulled = 0
        self.calls = 0
        self._gone = asyncio.Event()

    def disconnect(self) -> None:
        self._gone.set()

    async def __call__(self) -> dict[str, Any]:
        self.calls += 1
        if self.pulled < len(self.body) and not self._gone.is_set():
            part = self.body[self.pulled : self.pulled + self.chunk]
            self.pulled += len(part)
            return {"type": "http.request", "body": part, "more_body": self.pulled < len(self.body)}
        await self._gone.wait()
        return {"type": "http.disconnect"}


@dataclass
class Response:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[bytes] = field(default_factory=list)
    complete: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


OnChunk = Callable[[Response, bytes], Awaitable[None] | None]


async def call(
    app: Callable[..., Awaitable[None]],
    path: str,
    body: bytes,
    content_type: bytes | None,
    headers: dict[str, str] | None = None,
    *,
    feeder: Feeder | None = None,
    content_length: bool = True,
    on_chunk: OnChunk | None = None,
) -> Response:
    """POST `body` to `app` at `path`; the response as recorded."""
    feeder = feeder or Feeder(body)
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    if content_type is not None:
        raw.append((b"content-type", content_type))
    if content_length:
        raw.append((b"content-length", str(len(body)).encode()))
    scope = {"type": "http", "method": "POST", "path": path, "headers": raw}
    response = Response()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            response.status = message["status"]
            response.headers = {k.decode(): v.decode() for k, v in message["headers"]}
            return
        chunk = message.get("body", b"")
        response.chunks.append(chunk)
        if on_chunk is not None and chunk:
            result = on_chunk(response, chunk)
            if result is not None:
                await result
        if not message.get("more_body", False):
            response.complete.set()
            feeder.disconnect()  # the server's receive() says so once the answer is out

    await app(scope, feeder, send)
    return response
