"""Profile the runner's data path under steady load with py-spy.

    .venv/bin/python -m bench.proxy.profile [--kind json] [--clients 16] [--duration 10]
        [--ref HEAD] [--out /tmp/profile.txt] [--top 25] [--rate 250] [--native]
        [--tenants on|off]

Starts the same fake engine and runner as `bench.proxy.run`, drives the runner with wrk for
the duration plus a margin, and meanwhile samples the runner with
`py-spy record --format raw` (collapsed stacks; py-spy is not a project dependency:
`.venv/bin/pip install py-spy`). Then it prints, per function, the share of the runner's
busy samples spent in it (inclusive) and in its own code (self), and converts shares into
CPU microseconds per request with the runner CPU time measured over the same window.
`--tenants on|off`: the runner as bench.tenants.datapath's side of that name (8 tenants in
turn; `on` with their tenant policy), so the profile shows what tenant policy costs.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from bench.proxy.loadgen import run_wrk
from bench.proxy.procs import FEATURES_ON, code_snapshot, require_wrk, start_runner
from bench.proxy.run import BODIES, CHUNK_DELAY_MS, CHUNKS, LATENCY_MS, PATH
from tests.fixtures.launch import start_fake


def _py_spy() -> str:
    local = Path(sys.executable).with_name("py-spy")
    found = str(local) if local.exists() else shutil.which("py-spy")
    if found is None:
        sys.exit("needs py-spy: .venv/bin/pip install py-spy")
    return found


_IDLE = ("epoll_wait", "epoll_pwait", "select (", "poll (")
"""Leaf frames of a waiting event loop (a thread pool's idle worker: `_waiting_for_work`)."""
_SYSCALLS = ("write", "read", "getpid", "sendmsg", "recvmsg", "writev")
_COMPONENTS = (
    ("runner/scheduler/", "runner scheduler"),
    ("adapters/http_client.py", "engine client (adapters/http_client.py; its socket writes)"),
    ("runner/http/chat.py", "runner chat path (chat.py)"),
    ("runner/http/frontend.py", "runner front-end (frontend.py)"),
    ("runner/http/coalesce.py", "runner response writes (coalesce.py; its socket writes)"),
    ("runner/http/", "runner HTTP, other modules (limits, headers, asgi, app)"),
    ("runner/telemetry/", "runner metrics (telemetry/)"),
    ("runner/tenancy/", "runner tenancy (usage, budget headers)"),
    ("runner/", "runner, other modules"),
    ("adapters/", "adapters"),
    ("tenants/", "tenants (rate limit, fairness)"),
    ("limits/", "limits library"),
    ("uvicorn/", "uvicorn"),
    ("prometheus_client/", "prometheus_client"),
    ("asyncio/", "asyncio (Python part)"),
)


def _short(frame: str) -> str:
    """`handle (…/site-packages/uvicorn/x.py:80)` -> `uvicorn/x.py:handle`."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "/lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    if "bench-proxy-code-" in path:
        path = path.split("bench-proxy-code-", 1)[1].split("/", 1)[1]
    return f"{path}:{name}"


def _component(frames: list[str]) -> str:
    """Who the sample's CPU goes to: a syscall (named with the Python caller) or a module."""
    leaf = frames[-1]
    py = [f for f in frames if ".py:" in f]
    caller = _short(py[-1]) if py else "?"
    if "(libc.so" in leaf and leaf.split(" ", 1)[0] in _SYSCALLS:
        return f"syscall {leaf.split(' ', 1)[0]} from {caller}"
    if caller.startswith("asyncio/runners.py") and leaf == py[-1]:
        return "event loop (uvloop C code and its syscalls; use --native to split)"
    if ".py:" not in leaf:
        # C code: the loop itself when no runner/library Python frame is below it.
        if caller.startswith("asyncio/runners.py"):
            return "event loop (uvloop, C)"
        if "orjson" in leaf:
            return "orjson"
    for prefix, label in _COMPONENTS:
        if caller.startswith(prefix):
            return label
    return "other: " + caller


def _waiting_for_work(frames: list[str]) -> bool:
    """A thread pool's worker blocked on its queue (py-spy counts it busy): its deepest
    Python frame is the pool's `_worker` loop itself."""
    py = [f for f in frames if ".py:" in f]
    return bool(py) and py[-1].startswith("_worker (") and "concurrent/futures/thread.py" in py[-1]


def summarize(raw: str, top: int) -> dict[str, Any]:
    """Shares of the runner's busy samples (idle epoll waits excluded): by component, where
    syscalls are named with their Python caller, and inclusive per Python function."""
    inclusive: collections.Counter[str] = collections.Counter()
    components: collections.Counter[str] = collections.Counter()
    busy = idle = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        if any(frames[-1].startswith(i) for i in _IDLE) or _waiting_for_work(frames):
            idle += count
            continue
        busy += count
        components[_component(frames)] += count
        for name in {_short(f) for f in frames if ".py:" in f}:
            inclusive[name] += count
    total = max(1, busy)
    return {
        "busy_samples": busy,
        "idle_samples": idle,
        "components": [(n, c / total) for n, c in components.most_common(top)],
        "inclusive": [(n, c / total) for n, c in inclusive.most_common(top)],
    }


def _proc_io(pid: int) -> dict[str, int]:
    """Read/write syscall counts of a process (`/proc/<pid>/io`: syscr, syscw)."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return {k: int(fields[k]) for k in ("syscr", "syscw")}


def main() -> int:
    p = argparse.ArgumentParser(description="py-spy profile of the runner under wrk load")
    p.add_argument("--kind", choices=sorted(BODIES), default="json")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--duration", type=int, default=10)
    p.add_argument("--ref", default=None)
    p.add_argument("--out", type=Path, default=Path("/tmp/profile.txt"))
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--native", action="store_true", help="py-spy --native (C frames too)")
    p.add_argument("--tenants", choices=("on", "off"), help="bench.tenants.datapath's side")
    args = p.parse_args()
    require_wrk()
    spy = _py_spy()
    tmp_dir = tempfile.TemporaryDirectory(prefix="bench-profile-")
    tmp = Path(tmp_dir.name)
    env = dict(FEATURES_ON, USAGE_DB=str(tmp / "usage.sqlite3"))
    if args.tenants is not None:
        from bench.tenants.datapath import TENANTS, tenants_file

        os.environ["BENCH_TENANTS"] = ",".join(TENANTS)  # read by wrk.lua
        if args.tenants == "on":
            (tmp / "tenants.yaml").write_text(tenants_file())
            env["TENANTS_FILE"] = str(tmp / "tenants.yaml")
    body = json.dumps(BODIES[args.kind]).encode()
    fake_args = ["--latency-ms", str(LATENCY_MS), "--chunks", str(CHUNKS)]
    fake_args += ["--chunk-delay-ms", str(CHUNK_DELAY_MS)]
    with (
        tmp_dir,
        code_snapshot(args.ref) as code_dir,
        start_fake("fake_openai", *fake_args) as engine,
        start_runner(engine.url, 64, code_dir, env=env) as runner,
    ):
        url = runner.url + PATH
        run_wrk(url, body, args.clients, 2)  # warm-up
        load: dict[str, Any] = {}
        watch = {"runner": runner.proc.pid, "engine": engine.proc.pid}

        def drive() -> None:
            load.update(run_wrk(url, body, args.clients, args.duration + 3, watch))

        loader = threading.Thread(target=drive)
        io0 = _proc_io(runner.proc.pid)
        loader.start()
        cmd = [spy, "record", "-o", str(args.out), "--format", "raw"]
        cmd += ["-d", str(args.duration), "-r", str(args.rate), "-p", str(runner.proc.pid)]
        cmd += ["--native"] if args.native else []
        spy_run = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration + 60)
        loader.join()
        io = {k: v - io0[k] for k, v in _proc_io(runner.proc.pid).items()}
    if spy_run.returncode != 0:
        sys.exit(f"py-spy failed: {spy_run.stderr[-2000:]}")
    summary = summarize(args.out.read_text(), args.top)
    us_per_req = load["cpu_s"]["runner"] / load["requests"] * 1e6
    syscalls = {k: v / load["requests"] for k, v in io.items()}
    print(
        f"{args.kind} at {args.clients} clients through the runner: {load['rps']:.0f} req/s, "
        f"runner CPU {us_per_req:.0f} us/request, {summary['busy_samples']} busy samples "
        f"({summary['idle_samples']} idle ones left out; raw stacks in {args.out}); "
        f"per request: {syscalls['syscr']:.1f} read and {syscalls['syscw']:.1f} write syscalls"
    )
    for kind in ("components", "inclusive"):
        print(f"\n{kind:>10}  us/req  (share of busy samples; us = share x runner CPU/req)")
        for name, share in summary[kind]:
            print(f"{share:10.1%}  {share * us_per_req:6.0f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
