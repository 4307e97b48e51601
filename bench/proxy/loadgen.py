"""Load generators, each in its own process: `wrk` (closed loop, C) and the TTFB client.

`run_wrk` runs one fixed-duration wrk load with `wrk.lua` and returns the figures its
`done()` hook printed, plus the CPU seconds wrk itself used (to show it was not the
bottleneck), when given pids the CPU seconds those processes used meanwhile, and two noise
figures: cores the rest of the machine used meanwhile (`other_cores`, exact only when
`watch` names every process under test) and CPU pressure (PSI `some`).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.proxy.procs import REPO_ROOT, cpu_pressure_us, cpu_seconds, machine_cpu_busy_s

LUA = Path(__file__).with_name("wrk.lua")
_MARK = "BENCH_JSON "


class LoadError(RuntimeError):
    """The load generator failed or printed no result."""


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _parse(stdout: str, what: str) -> dict[str, Any]:
    for line in stdout.splitlines():
        if line.startswith(_MARK):
            data: dict[str, Any] = json.loads(line[len(_MARK) :])
            return data
    raise LoadError(f"{what} printed no {_MARK.strip()} line:\n{stdout[-2000:]}")


def run_wrk(
    url: str,
    body: bytes,
    connections: int,
    duration_s: float,
    watch: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """One wrk run (1 thread, `connections` keep-alive connections, bounded duration)."""
    env = dict(os.environ, BENCH_BODY=body.decode(), BENCH_TENANT="bench-tenant")
    cmd = [
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{max(1, round(duration_s))}s",
        "--timeout",
        "5s",
        "-s",
        str(LUA),
        url,
    ]
    watch = watch or {}
    cpu0 = {name: cpu_seconds(pid) for name, pid in watch.items()}
    child0 = _children_cpu()
    busy0, psi0 = machine_cpu_busy_s(), cpu_pressure_us()
    out = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=duration_s + 30, check=False
    )
    child1 = _children_cpu()
    cpu1 = {name: cpu_seconds(pid) for name, pid in watch.items()}
    busy1, psi1 = machine_cpu_busy_s(), cpu_pressure_us()
    if out.returncode != 0:
        raise LoadError(f"wrk exited with {out.returncode}: {out.stderr[-2000:]}")
    res = _parse(out.stdout, "wrk")
    dur = res["duration_us"] / 1e6
    res["rps"] = res["requests"] / dur if dur > 0 else 0.0
    res["errors"] = sum(res[k] for k in res if k.startswith("err_"))
    res["cpu_s"] = {"wrk": round(child1 - child0, 3)}
    for name in watch:
        res["cpu_s"][name] = round(cpu1[name] - cpu0[name], 3)
    # Noise: CPU the rest of the machine used meanwhile (in cores), and the share of the
    # time some task (ours included) was waiting for a CPU (PSI "some").
    ours = sum(res["cpu_s"].values())
    res["other_cores"] = round(max(0.0, busy1 - busy0 - ours) / dur, 3)
    res["cpu_pressure"] = round((psi1 - psi0) / res["duration_us"], 3)
    return res


def run_ttfb(url: str, body: bytes, connections: int, duration_s: float) -> dict[str, Any]:
    """One run of the asyncio streaming client (`bench.proxy.ttfb`) in its own process."""
    cmd = [
        sys.executable,
        "-m",
        "bench.proxy.ttfb",
        "--url",
        url,
        "--concurrency",
        str(connections),
        "--duration",
        str(duration_s),
    ]
    out = subprocess.run(
        cmd,
        cwd=REPO_ROOT,
        input=body.decode(),
        capture_output=True,
        text=True,
        timeout=duration_s + 30,
        check=False,
    )
    if out.returncode != 0:
        raise LoadError(f"ttfb client exited with {out.returncode}: {out.stderr[-2000:]}")
    return _parse(out.stdout, "ttfb client")
