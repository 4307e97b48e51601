"""Instructions the runner's request path executes per JSON request, counted by callgrind.

    .venv/bin/python -m bench.proxy.instructions [--ref HEAD] [--small 5] [--large 25]

The CPU figures of `bench.proxy.compare` move by tens of µs from one run to the next on
this shared two-core machine (the same code read 194 to 313 µs per JSON request on one
day); a count of instructions does not. This drives the runner's ASGI app in process, as
uvicorn would hand it requests (64 callers, each sending its requests one after the
other), against the fake engine over loopback, under `valgrind --tool=callgrind` (not a
project dependency: `apt-get install valgrind`). Two runs, `--small` and `--large`
requests per caller after the same warm-up; the difference of their instruction totals
over the difference of their requests is the app's count per request (start-up, imports
and warm-up cancel out): the front-end, the chat path, the scheduler, metrics, rate
limit, usage, and the engine client with the event loop. uvicorn's own work (parsing, the
response cycle, the sockets to clients) is not in it. The fake engine runs outside
valgrind. Two runs of the same code agree within about 1%.

`--whole`: the whole runner instead (`python -m runner` as `bench.proxy.compare` starts
it, uvicorn included) under callgrind, driven by wrk at 64 connections for `--small` and
then `--large` seconds; the difference of the instruction totals at exit over the
difference of the requests answered. Slower (~5 min), and it works for any ref that
runs; the count depends a little on how requests batch (within ~2%).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.proxy.loadgen import run_wrk
from bench.proxy.procs import FEATURES_ON, REPO_ROOT, code_snapshot, require_wrk, start_runner
from bench.proxy.run import BODIES, CHUNK_DELAY_MS, CHUNKS, LATENCY_MS, PATH

CALLERS = 64
WARM_UP = 20  # requests per caller before the counted ones
_HEADERS = [
    (b"host", b"127.0.0.1:1"),
    (b"content-type", b"application/json"),
    (b"x-tenant-id", b"bench"),
    (b"x-priority", b"normal"),
]


def _no_watch(_fire: object) -> None:
    """The connection's disconnect hook (runner/http/limits.py): this client never leaves."""


async def _one(app: Any, body: bytes, statuses: list[int]) -> None:
    """One request through the app, as uvicorn's scope and channels would carry it."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 1),
        "client": ("127.0.0.1", 2),
        "scheme": "http",
        "method": "POST",
        "root_path": "",
        "path": PATH,
        "raw_path": PATH.encode(),
        "query_string": b"",
        "headers": [*_HEADERS, (b"content-length", b"%d" % len(body))],
        "quorum.on_gone": _no_watch,  # `runner.http.asgi.GONE_HOOK`, as the runner's own
        # protocol gives it (no task per request); a string, so that any --ref can read it
    }
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    await app(scope, receive, send)


async def _drive(engine_url: str, per_caller: int) -> None:
    """Start the runner's app on the fake engine, warm it up, then send the counted load."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-instructions-"))
    (tmp / "models.yaml").write_text(
        f"models:\n  - id: echo\n    backend: openai\n    url: {engine_url}\n    parallel: 64\n"
    )
    for name in ("REDIS_URL", "QUEUE_TIMEOUT_MS"):
        os.environ.pop(name, None)
    os.environ.update(
        HOST="127.0.0.1",
        PORT="1",
        LOG_LEVEL="warning",
        LOG_FORMAT="json",
        ENABLE_METRICS="true",
        ENABLE_MULTI_TENANT="true",
        MODELS_CONFIG=str(tmp / "models.yaml"),
        **FEATURES_ON,
    )
    from runner.runtime.cli import app_from_environment
    from runner.telemetry.health import Life

    _settings, app = app_from_environment(None)
    await app.startup()
    while app.rt.life is not Life.READY:
        await asyncio.sleep(0.05)
    body = json.dumps(BODIES["json"]).encode()
    statuses: list[int] = []

    async def caller(n: int) -> None:
        for _ in range(n):
            await _one(app, body, statuses)

    await asyncio.gather(*(caller(WARM_UP) for _ in range(CALLERS)))
    await asyncio.gather(*(caller(per_caller) for _ in range(CALLERS)))
    await app.shutdown()
    refused = [s for s in statuses if s != 200]
    if refused:
        raise SystemExit(f"{len(refused)} requests not answered 200: {refused[:5]}")


def _child(engine_url: str, per_caller: int) -> None:
    import uvloop

    uvloop.install()
    asyncio.run(_drive(engine_url, per_caller))


def _count(code: Path, engine_url: str, per_caller: int) -> int:
    """Instructions of one whole run of the child under callgrind."""
    with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as tmp:
        out = Path(tmp) / "callgrind.out"
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))  # bench/, tests/ (code: cwd first)
        cmd = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            "bench.proxy.instructions",
            "--child",
            engine_url,
            str(per_caller),
        ]
        subprocess.run(cmd, cwd=code, env=env, check=True, capture_output=True)
        return callgrind_total(out)


def _whole(code: Path, engine_url: str, seconds: int) -> tuple[int, int]:
    """(requests answered, instructions) of a whole runner under callgrind, from its start
    to its exit, serving wrk at 64 connections for `seconds`."""
    with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as tmp:
        out = Path(tmp) / "callgrind.out"
        profiler = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        body = json.dumps(BODIES["json"]).encode()
        with start_runner(engine_url, 64, code, timeout=900, prefix=profiler, grace_s=600) as r:
            answered = int(run_wrk(r.url + PATH, body, 64, seconds)["requests"])
        return answered, callgrind_total(out)


def callgrind_total(out: Path) -> int:
    """The instructions a callgrind output file counts in all."""
    for line in out.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError("callgrind wrote no totals")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ref", default=None, help="a commit to measure (default: the work tree)")
    p.add_argument(
        "--small", type=int, default=5, help="requests per caller (--whole: s of wrk, 10)"
    )
    p.add_argument("--large", type=int, default=25, help="requests per caller (--whole: s, 30)")
    p.add_argument("--whole", action="store_true", help="the whole runner under wrk")
    p.add_argument("--child", nargs=2, metavar=("ENGINE_URL", "PER_CALLER"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(args.child[0], int(args.child[1]))
        return 0
    from tests.fixtures.launch import start_fake

    name = args.ref or "work tree"
    if args.whole:
        require_wrk()
        small, large = args.small or 10, args.large or 30
        fake = ["--latency-ms", str(LATENCY_MS), "--chunks", str(CHUNKS)]
        fake += ["--chunk-delay-ms", str(CHUNK_DELAY_MS)]
        with start_fake("fake_openai", *fake) as engine, code_snapshot(args.ref) as code:
            (n1, i1), (n2, i2) = _whole(code, engine.url, small), _whole(code, engine.url, large)
        print(f"{name}: {(i2 - i1) / (n2 - n1):,.0f} instructions per JSON request, whole runner")
        return 0
    with start_fake("fake_openai", "--latency-ms", "2") as engine, code_snapshot(args.ref) as code:
        small, large = args.small or 5, args.large or 25
        first, second = _count(code, engine.url, small), _count(code, engine.url, large)
    per_request = (second - first) / ((large - small) * CALLERS)
    print(f"{name}: {per_request:,.0f} instructions per JSON request, the app in process")
    return 0


if __name__ == "__main__":
    sys.exit(main())
