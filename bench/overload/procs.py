"""The processes of the overload bench: runners, the null server, the load generators.

Each runs on 127.0.0.1 in its own process group and is killed with it (SIGTERM, then
SIGKILL) when its block ends, whatever happened. Reuses `bench.proxy.procs` for ports,
health polling, group kills and CPU accounting.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.proxy import procs as proxy_procs
from bench.proxy.procs import (
    REPO_ROOT,
    RunnerProc,
    _kill_group,
    _wait_healthy,
    cpu_seconds,
    free_port,
)

_MARK = "BENCH_JSON "


@contextlib.contextmanager
def start_runner(
    engine_url: str,
    parallel: int,
    env_extra: dict[str, str],
    code_dir: Path,
    frozen_gc: bool = False,
    timing_out: Path | None = None,
    timeout: float = 30.0,
) -> Iterator[RunnerProc]:
    """`bench.proxy.procs.start_runner` with this bench's limits (`env_extra`, else defaults).

    With `frozen_gc` or `timing_out` it runs `bench.overload.instrumented_runner` instead;
    `timing_out` is written when the runner exits, i.e. after this block.
    """
    env = dict(env_extra)
    module = "runner"
    if frozen_gc or timing_out:  # the launcher is in bench/; the runner stays code_dir's
        module = "bench.overload.instrumented_runner"
        env["PYTHONPATH"] = str(REPO_ROOT)
        env["OVERLOAD_GC_FREEZE"] = "1" if frozen_gc else "0"
        env["OVERLOAD_TIMING_OUT"] = str(timing_out or "")
    with proxy_procs.start_runner(
        engine_url, parallel, code_dir, timeout, env=env, module=module, log_format="text"
    ) as runner:
        yield runner


@contextlib.contextmanager
def start_null_server(timeout: float = 15.0) -> Iterator[RunnerProc]:
    """The fixed-429 reference server (`bench.overload.null_server`) on a free port."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.overload.null_server", "--port", str(port)],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}", timeout)
        yield RunnerProc(proc, port, {})
    finally:
        _kill_group(proc)


def schedstat(pid: int) -> tuple[float, float, int]:
    """Main thread's (on-CPU s, run-queue wait s, timeslices) from /proc (zeros if gone)."""
    try:
        run_ns, wait_ns, slices = Path(f"/proc/{pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return 0.0, 0.0, 0
    return int(run_ns) / 1e9, int(wait_ns) / 1e9, int(slices)


def loadgen_cmd(url: str, duration: float, warmup: float, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bench.overload.loadgen",
        "--url",
        url,
        "--duration",
        f"{duration:g}",
        "--warmup",
        f"{warmup:g}",
        *extra,
    ]


def _spawn(cmd: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _collect(procs: list[subprocess.Popen[str]], timeout: float) -> list[dict[str, Any]]:
    """Wait for the load generators; kill any left over; parse their BENCH_JSON lines."""
    results = []
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            line = next((ln for ln in out.splitlines() if ln.startswith(_MARK)), None)
            if p.returncode != 0 or line is None:
                raise RuntimeError(f"load generator failed ({p.returncode}): {err[-2000:]}")
            results.append(json.loads(line[len(_MARK) :]))
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return results


def run_load(
    cmds: list[list[str]], duration: float, watch: dict[str, int]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run load generators side by side; also what the watched pids used meanwhile.

    Per watched pid: CPU seconds (all threads), and from the main thread's schedstat the
    mean time it waited on the run queue per time slice (how long the OS kept it from a
    core after it became runnable, on average).
    """
    cpu0 = {name: cpu_seconds(pid) for name, pid in watch.items()}
    st0 = {name: schedstat(pid) for name, pid in watch.items()}
    results = _collect([_spawn(c) for c in cmds], duration + 30)
    usage: dict[str, Any] = {}
    for name, pid in watch.items():
        st1 = schedstat(pid)
        slices = st1[2] - st0[name][2]
        wait = st1[1] - st0[name][1]
        usage[name] = {
            "cpu_s": round(cpu_seconds(pid) - cpu0[name], 3),
            "runq_wait_s": round(wait, 3),
            "runq_wait_ms_per_slice": round(1e3 * wait / slices, 3) if slices else 0.0,
        }
    return results, usage
