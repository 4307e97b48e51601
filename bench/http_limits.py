"""What the client limits (runner/http/limits.py) cost per request, in process.

    .venv/bin/python -m bench.http_limits [--requests 20000] [--reps 7]

One uvloop event loop, one kept-alive connection on an in-memory transport, a trivial
ASGI app answering 200 at once; the request is the proxy benchmark's (a chat completion
with the headers the data path reads). Each repetition serves `--requests` requests through
uvicorn's protocol with coalesced writes (`CoalescingHttpToolsProtocol`, before) and through
`GuardedHttpToolsProtocol` (after), interleaved; the figures are medians of the CPU time
per request (this thread's) of each, and of the differences within a pair. No network, no
runner: only what the protocol class adds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import uvloop
from uvicorn.config import Config
from uvicorn.server import ServerState

from runner.http.coalesce import CoalescingHttpToolsProtocol
from runner.http.limits import ClientLimits, protocol_with

BODY = b'{"model":"echo","messages":[{"role":"user","content":"hi"}],"max_tokens":32}'
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
    b"User-Agent: wrk\r\nContent-Type: application/json\r\n"
    b"X-Tenant-ID: bench-tenant\r\nX-Priority: normal\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
)


class MemoryTransport:
    """Enough of an asyncio transport for uvicorn's protocol: counts what it is given."""

    def __init__(self) -> None:
        self.written = 0
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written += 1

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 5555)}.get(name, default)

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None: ...


async def app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await receive()
    headers = [(b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"{}"})


async def serve(protocol_class: type[Any], requests: int) -> float:
    """Seconds per request through `protocol_class`, on one kept-alive connection."""
    config = Config(app, lifespan="off", access_log=False, log_config=None, server_header=False)
    config.load()
    state = ServerState()
    loop = asyncio.get_running_loop()
    proto = protocol_class(config=config, server_state=state, app_state={}, _loop=loop)
    transport = MemoryTransport()
    proto.connection_made(transport)
    started = time.thread_time()
    for _ in range(requests):
        proto.data_received(REQUEST)
        while state.tasks:
            await asyncio.sleep(0)
    await asyncio.sleep(0)
    elapsed = time.thread_time() - started
    assert transport.written >= requests, transport.written
    proto.connection_lost(None)
    return elapsed / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    guarded = protocol_with(ClientLimits())
    before: list[float] = []
    after: list[float] = []
    for rep in range(args.reps):
        pair = [(CoalescingHttpToolsProtocol, before), (guarded, after)]
        for cls, out in pair if rep % 2 == 0 else pair[::-1]:
            out.append(uvloop.run(serve(cls, args.requests)))
    diffs = [(a - b) * 1e6 for a, b in zip(after, before, strict=True)]
    print(f"{args.reps} interleaved pairs x {args.requests} requests, µs per request (median):")
    print(f"  before (CoalescingHttpToolsProtocol): {statistics.median(before) * 1e6:.2f}")
    print(f"  after  (GuardedHttpToolsProtocol):    {statistics.median(after) * 1e6:.2f}")
    print(f"  added: {statistics.median(diffs):+.2f} [{min(diffs):+.2f}, {max(diffs):+.2f}]")


if __name__ == "__main__":
    main()
