"""Instructions the HTTP server itself executes per request, counted by callgrind.

    .venv/bin/python -m bench.proxy.server_floor [--protocol runner|uvicorn] [--ref REF]

A trivial ASGI app (reads the body, answers 250 bytes of JSON with two headers) served by
uvicorn with uvloop, through the runner's connection protocol (`--protocol runner`:
`runner.http.limits.protocol_with`, coalesced writes and the client limits) or uvicorn's
own httptools protocol (`uvicorn`), under `valgrind --tool=callgrind`, driven by wrk at 64
connections for `--small` then `--large` seconds; the difference of the instruction totals
at exit over the difference of the requests answered. What `bench.proxy.instructions`
leaves out of the app's count (uvicorn's parsing, the response cycle, the sockets to
clients), with nothing of the runner's app in it. Needs valgrind and wrk, as that does.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.proxy.instructions import callgrind_total
from bench.proxy.loadgen import run_wrk
from bench.proxy.procs import REPO_ROOT, code_snapshot, free_port, require_wrk
from bench.proxy.run import BODIES, PATH

ANSWER = (
    b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"echo","choices":'
    b'[{"index":0,"message":{"role":"assistant","content":"hello hello hello hello"},'
    b'"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":4,'
    b'"total_tokens":14}}'
)
_HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(ANSWER))]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Read the whole body, answer `ANSWER`."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})


def _serve(port: int, protocol: str) -> None:
    import uvicorn

    http: Any = "httptools"
    if protocol == "runner":
        from runner.http.limits import ClientLimits, protocol_with

        http = protocol_with(ClientLimits())
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http=http,
        access_log=False,
        proxy_headers=False,
        server_header=False,
        log_config=None,
        lifespan="on",
    )


def _count(code: Path, protocol: str, seconds: int) -> tuple[int, int]:
    """(requests answered, instructions) of one server under callgrind, start to exit."""
    with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as tmp:
        out, port = Path(tmp) / "callgrind.out", free_port()
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))  # bench/ (code: cwd first)
        cmd = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            "bench.proxy.server_floor",
            "--serve",
            str(port),
            protocol,
        ]
        url = f"http://127.0.0.1:{port}{PATH}"
        with subprocess.Popen(cmd, cwd=code, env=env, stderr=subprocess.DEVNULL) as server:
            deadline = time.monotonic() + 300
            while True:
                try:
                    urllib.request.urlopen(urllib.request.Request(url, data=b"{}"), timeout=5)
                    break
                except OSError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise RuntimeError("the server under callgrind did not answer") from None
                    time.sleep(0.5)
            body = json.dumps(BODIES["json"]).encode()
            answered = int(run_wrk(url, body, 64, seconds)["requests"])
            server.send_signal(signal.SIGINT)
            server.wait(300)
        return answered, callgrind_total(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--protocol", choices=("runner", "uvicorn"), default="runner")
    p.add_argument("--ref", default=None, help="a commit to measure (default: the work tree)")
    p.add_argument("--small", type=int, default=5, help="seconds of load, first run")
    p.add_argument("--large", type=int, default=15, help="seconds of load, second run")
    p.add_argument("--serve", nargs=2, metavar=("PORT", "PROTOCOL"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        _serve(int(args.serve[0]), args.serve[1])
        return 0
    require_wrk()
    with code_snapshot(args.ref) as code:
        (n1, i1) = _count(code, args.protocol, args.small)
        (n2, i2) = _count(code, args.protocol, args.large)
    name = f"{args.ref or 'work tree'}, {args.protocol}'s protocol"
    print(f"{name}: {(i2 - i1) / (n2 - n1):,.0f} instructions per request, the server alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
