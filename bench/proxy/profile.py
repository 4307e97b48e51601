"""Profile the runner's data path under steady load with py-spy.

    .venv/bin/python -m bench.proxy.profile [--kind json] [--clients 16] [--duration 10]
        [--ref HEAD] [--out /tmp/profile.txt] [--top 25]

Starts the same fake engine and runner as `bench.proxy.run`, drives the runner with wrk for
the duration plus a margin, and meanwhile samples the runner with
`py-spy record --format raw` (collapsed stacks; py-spy is not a project dependency:
`.venv/bin/pip install py-spy`). Then it prints, per function, the share of the runner's
busy samples spent in it (inclusive) and in its own code (self), and converts shares into
CPU microseconds per request with the runner CPU time measured over the same window.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from bench.proxy.loadgen import run_wrk
from bench.proxy.procs import code_snapshot, require_wrk, start_runner
from bench.proxy.run import BODIES, CHUNK_DELAY_MS, CHUNKS, LATENCY_MS, PATH
from tests.fixtures.launch import start_fake


def _py_spy() -> str:
    local = Path(sys.executable).with_name("py-spy")
    found = str(local) if local.exists() else shutil.which("py-spy")
    if found is None:
        sys.exit("needs py-spy: .venv/bin/pip install py-spy")
    return found


def _frame_name(frame: str) -> str:
    """`handle (runner/proxy.py:80)` -> `runner/proxy.py:handle`; keeps files short."""
    name, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0]
    for marker in ("site-packages/", "/lib/python3.11/", "bench-proxy-code-"):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker == "bench-proxy-code-":
                path = path.split("/", 1)[1]
    return f"{path}:{name}"


def summarize(raw: str, top: int) -> dict[str, Any]:
    """Inclusive and self shares per function from py-spy's collapsed stacks."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_frame_name(f) for f in stack.split(";") if f and not f.startswith("process ")]
        frames = [f for f in frames if not f.startswith("thread ")]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count
    return {
        "samples": total,
        "inclusive": [(n, c / total) for n, c in inclusive.most_common(top)],
        "self": [(n, c / total) for n, c in own.most_common(top)],
    }


def main() -> int:
    p = argparse.ArgumentParser(description="py-spy profile of the runner under wrk load")
    p.add_argument("--kind", choices=sorted(BODIES), default="json")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--duration", type=int, default=10)
    p.add_argument("--ref", default=None)
    p.add_argument("--out", type=Path, default=Path("/tmp/profile.txt"))
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    require_wrk()
    spy = _py_spy()
    body = json.dumps(BODIES[args.kind]).encode()
    fake_args = ["--latency-ms", str(LATENCY_MS), "--chunks", str(CHUNKS)]
    fake_args += ["--chunk-delay-ms", str(CHUNK_DELAY_MS)]
    with (
        code_snapshot(args.ref) as code_dir,
        start_fake("fake_openai", *fake_args) as engine,
        start_runner(engine.url, 64, code_dir) as runner,
    ):
        url = runner.url + PATH
        run_wrk(url, body, args.clients, 2)  # warm-up
        load: dict[str, Any] = {}
        watch = {"runner": runner.proc.pid, "engine": engine.proc.pid}

        def drive() -> None:
            load.update(run_wrk(url, body, args.clients, args.duration + 3, watch))

        loader = threading.Thread(target=drive)
        loader.start()
        cmd = [spy, "record", "-o", str(args.out), "--format", "raw"]
        cmd += ["-d", str(args.duration), "-p", str(runner.proc.pid)]
        spy_run = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration + 60)
        loader.join()
    if spy_run.returncode != 0:
        sys.exit(f"py-spy failed: {spy_run.stderr[-2000:]}")
    summary = summarize(args.out.read_text(), args.top)
    us_per_req = load["cpu_s"]["runner"] / load["requests"] * 1e6
    print(
        f"{args.kind} at {args.clients} clients through the runner: {load['rps']:.0f} req/s, "
        f"runner CPU {us_per_req:.0f} us/request, {summary['samples']} busy samples "
        f"(raw stacks in {args.out})"
    )
    for kind in ("self", "inclusive"):
        print(f"\n{kind:>9}  us/req  function")
        for name, share in summary[kind]:
            print(f"{share:9.1%}  {share * us_per_req:6.0f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
