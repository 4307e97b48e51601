"""Experiments: `python -m runner` with a collector change and/or its own refusal timing.

    OVERLOAD_GC_FREEZE=1 OVERLOAD_TIMING_OUT=/tmp/t.json \
        python -m bench.overload.instrumented_runner

Same environment variables as `python -m runner`, plus:

- `OVERLOAD_GC_FREEZE=1`: import what `quorum serve` imports, collect once and `gc.freeze()`
  before serving. Importing the runner (FastAPI, pydantic, prometheus_client, uvicorn,
  cryptography, ...) leaves ~78,000 objects tracked by the garbage collector; a full
  (generation 2) collection walks them all, 25-65 ms on this machine, and the event loop
  answers nobody meanwhile. Under the overload bench's load one runs every ~10 s. Frozen,
  they are never walked again. (The runner itself freezes once it is ready since 346c24f;
  this flag stays for measuring commits before that.)
- `OVERLOAD_TIMING_OUT=<file>`: time every inference request inside the runner, from the
  moment uvicorn calls the chat path (`runner.http.frontend.FrontEnd.__call__` on a
  `CHAT_PATHS` path) to the moment it
  returns (the last byte handed to uvicorn), and write `[[wall start, status, seconds],
  ...]` to the file when the process exits (after SIGTERM). Costs a closure and two clock
  reads per request. It separates the runner's own code from what uvicorn, the kernel and
  the client add to a refusal.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import sys
import time
from typing import Any

import runner.http.app
import runner.http.chat
import runner.http.server
import tenants.config
from runner.http.asgi import Message, Receive, Scope, Send
from runner.http.call import Serve
from runner.http.chat import CHAT_PATHS
from runner.http.frontend import FrontEnd
from runner.runtime.cli import main

_records: list[tuple[float, int, float]] = []


def _install_timing(out: str) -> None:
    original = FrontEnd.__call__

    async def timed(
        self: FrontEnd, scope: Scope, receive: Receive, send: Send, serve: Serve, **kw: Any
    ) -> None:
        if scope["path"] not in CHAT_PATHS:
            await original(self, scope, receive, send, serve, **kw)
            return
        status = [0]

        async def send_and_note(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        wall, t0 = time.time(), time.perf_counter()
        await original(self, scope, receive, send_and_note, serve, **kw)
        _records.append((wall, status[0], time.perf_counter() - t0))

    def dump() -> None:
        with open(out, "w") as f:
            json.dump(_records, f)

    setattr(FrontEnd, "__call__", timed)  # noqa: B010 - an experiment, not the runner
    atexit.register(dump)


def run() -> Any:
    assert runner.http.app and runner.http.server and tenants.config and runner.http.chat
    out = os.environ.get("OVERLOAD_TIMING_OUT")
    if out:
        _install_timing(out)
    if os.environ.get("OVERLOAD_GC_FREEZE") == "1":
        gc.collect()
        gc.freeze()
    return main(["serve"])


if __name__ == "__main__":
    sys.exit(run())
