"""The cyclic garbage collector's CPU inside the runner, per request, under wrk load.

    .venv/bin/python -m bench.proxy.gc_cost [--ref HEAD] [--clients 64] [--duration 8]
        [--kind json] [--young N]

Starts the fake engine and a runner as `bench.proxy.run` does, the runner with a
`sitecustomize` (a temporary folder put first on its PYTHONPATH) that times every
collection with `gc.callbacks` (CPU time of the collecting thread) and writes the totals
per generation once a second. Prints, over one wrk run: collections per generation and
their CPU per request, beside the runner's whole CPU per request. `--young N` sets the
young generation's threshold in the runner from its start (the runner sets its own once
ready: `runner.http.app.GC_YOUNG_THRESHOLD`, which wins where it exists).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.proxy.loadgen import run_wrk
from bench.proxy.procs import code_snapshot, require_wrk, start_runner
from bench.proxy.run import BODIES, CHUNK_DELAY_MS, CHUNKS, LATENCY_MS, PATH
from tests.fixtures.launch import start_fake

PROBE = """
import gc, json, os, threading, time
_out = os.environ.get("BENCH_GC_OUT")
if _out:
    if os.environ.get("BENCH_GC_YOUNG"):
        gc.set_threshold(int(os.environ["BENCH_GC_YOUNG"]), *gc.get_threshold()[1:])
    _totals = {"collections": [0, 0, 0], "cpu_s": [0.0, 0.0, 0.0]}
    _began = [0.0]

    def _timed(phase, info):
        if phase == "start":
            _began[0] = time.thread_time()
            return
        generation = info["generation"]
        _totals["collections"][generation] += 1
        _totals["cpu_s"][generation] += time.thread_time() - _began[0]

    def _write():
        path = f"{_out}.{os.getpid()}"
        while True:
            time.sleep(0.5)
            state = dict(_totals, threshold=gc.get_threshold(), frozen=gc.get_freeze_count())
            with open(path + ".tmp", "w") as f:
                json.dump(state, f)
            os.replace(path + ".tmp", path)

    gc.callbacks.append(_timed)
    threading.Thread(target=_write, daemon=True).start()
"""


@contextlib.contextmanager
def _environ(extra: dict[str, str]) -> Iterator[None]:
    """`extra` in the environment while the runner starts (it inherits it), not the engine."""
    saved = dict(os.environ)
    os.environ.update(extra)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _read(out: Path, pid: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(f"{out}.{pid}").read_text())
    return data


def main() -> int:
    p = argparse.ArgumentParser(description="the runner's GC CPU per request under load")
    p.add_argument("--ref", default=None)
    p.add_argument("--kind", choices=sorted(BODIES), default="json")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--young", type=int, default=None, help="young threshold from start-up")
    args = p.parse_args()
    require_wrk()
    body = json.dumps(BODIES[args.kind]).encode()
    fake_args = ["--latency-ms", str(LATENCY_MS), "--chunks", str(CHUNKS)]
    fake_args += ["--chunk-delay-ms", str(CHUNK_DELAY_MS)]
    with (
        tempfile.TemporaryDirectory(prefix="bench-gc-") as tmp,
        code_snapshot(args.ref) as code_dir,
        start_fake("fake_openai", *fake_args) as engine,
    ):
        Path(tmp, "sitecustomize.py").write_text(PROBE)
        out = Path(tmp) / "gc"
        probe = {"PYTHONPATH": os.pathsep.join(filter(None, [tmp, os.environ.get("PYTHONPATH")]))}
        probe["BENCH_GC_OUT"] = str(out)
        if args.young is not None:
            probe["BENCH_GC_YOUNG"] = str(args.young)
        with _environ(probe), start_runner(engine.url, 64, code_dir) as runner:
            pid = runner.proc.pid
            url = runner.url + PATH
            run_wrk(url, body, args.clients, 2)  # warm-up
            time.sleep(1.0)
            before = _read(out, pid)
            load = run_wrk(url, body, args.clients, args.duration, {"runner": pid})
            time.sleep(1.0)
            after = _read(out, pid)
    requests = max(1, load["requests"])
    print(
        f"{args.kind} at {args.clients} clients: {load['rps']:.0f} req/s, runner CPU "
        f"{load['cpu_s']['runner'] / requests * 1e6:.0f} us/request; GC threshold "
        f"{after['threshold']}, {after['frozen']} objects frozen"
    )
    total = 0.0
    for g in range(3):
        n = after["collections"][g] - before["collections"][g]
        cpu = after["cpu_s"][g] - before["cpu_s"][g]
        total += cpu
        print(f"  generation {g}: {n} collections, {cpu / requests * 1e6:.1f} us/request")
    print(f"  all generations: {total / requests * 1e6:.1f} us/request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
