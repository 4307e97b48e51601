"""The runner served by granian instead of uvicorn: the ASGI-server choice, measured.

    python -m bench.proxy.granian_runner      (the same environment as `python -m runner`)

Builds the runner's app exactly as `quorum serve` does (`runner/runtime/cli.py`), then serves it
with granian's embedded ASGI server (Rust HTTP/1, one runtime thread, uvloop) in place of
uvicorn with httptools and `GuardedHttpToolsProtocol`. The client limits of
`runner/http/limits.py` (431/408, connection bound) are not there: a measurement of the
server, not a way to run the runner. Compared with
`bench.proxy.compare --before HEAD --after HEAD --after-module bench.proxy.granian_runner`.
"""

from __future__ import annotations

import sys

import uvloop
from granian.constants import Interfaces
from granian.server.embed import Server

from runner.runtime.cli import app_from_environment


def main() -> int:
    built = app_from_environment()
    if isinstance(built, str):
        print(f"granian_runner: {built}", file=sys.stderr)
        return 2
    settings, app = built
    server = Server(
        app,
        address=settings.host,
        port=settings.port,
        interface=Interfaces.ASGI,
        log_enabled=False,
    )
    uvloop.run(server.serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
