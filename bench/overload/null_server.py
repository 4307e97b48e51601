"""A reference server that refuses everything at once: the floor a refusal can reach here.

    python -m bench.overload.null_server --port P

Served exactly as the runner is (uvicorn, uvloop, httptools, no access log), it answers
every POST with a fixed 429 and a small JSON error body after reading the request body,
and `GET /health` with 200. Timed by the same probe client during the overload runs, it
shows what the machine itself (2 shared cores, the other processes) adds to any refusal,
apart from what the runner's own code costs.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import uvicorn

Message = MutableMapping[str, Any]
_BODY = (
    b'{"error":{"code":"rate_limit_exceeded","message":"null server refuses everything",'
    b'"type":"rate_limit_error"}}'
)
_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", b"%d" % len(_BODY)),
    (b"retry-after", b"1"),
]


async def app(
    scope: MutableMapping[str, Any],
    receive: Callable[[], Awaitable[Message]],
    send: Callable[[Message], Awaitable[None]],
) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    if scope["method"] == "GET":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    await send({"type": "http.response.start", "status": 429, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": _BODY})


def main() -> None:
    p = argparse.ArgumentParser(description="fixed-429 reference server")
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        server_header=False,
        log_level="warning",
        timeout_keep_alive=30,
    )


if __name__ == "__main__":
    main()
