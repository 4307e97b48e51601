"""P4: what a refusal costs through HTTP at 2x overload, and whether goodput holds.

    .venv/bin/python -m bench.overload.run [--duration 20] [--reps 3] [--quick] [--ref HEAD]

What it does (everything on 127.0.0.1, each piece its own process):
1. starts the fake OpenAI engine with a fixed 50 ms latency and runner A attached to it
   with the model at `parallel: 4`, default `MAX_QUEUE_DEPTH` (16), no rate limit;
2. saturation: closed loops of 4 and 8 clients through runner A (8 keeps the runner's
   queue non-empty, so no slot ever idles), and 4 clients straight to the engine for
   reference; saturation is the best of the two through the runner;
3. starts runner B, the same but with `DEFAULT_RATE_LIMIT` per tenant set so that the four
   tenants together may pass ~1.2x saturation, and `TENANT_RATE_LIMIT_probe=1req/hour`;
   an idle 429 floor: a light probe client alone against runner B;
4. `--reps` times: saturation again (8 clients, runner A), then Poisson open-loop load at
   2x that saturation from 4 tenants, (a) against runner A: queue backpressure, refusals
   are 503 `queue_full`; (b) against runner B: most refusals are 429. Beside the main load
   generator a second light client (the "probe", 20 req/s, constant rate, part of the 2x)
   times refusals from a process that is itself idle, to tell client overhead from server
   cost;
5. writes `bench/results/overload-<time>.json` and prints the Markdown table for
   docs/benchmarks.md ("Overload through HTTP (P4)").

Goodput is 200 answers per second over the measured window (warm-up left out) divided by
the saturation measured in the same repetition. Refusal latency is timed by the client from
writing the request to the end of the answer. Targets: refusals <= 2 ms p99, goodput
>= 0.95x saturation.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from bench.overload import report
from bench.proxy.procs import (
    REPO_ROOT,
    RunnerProc,
    StartError,
    _kill_group,
    _wait_healthy,
    code_snapshot,
    cpu_seconds,
    free_port,
    loadavg,
    machine_facts,
    resolve_ref,
)
from tests.fixtures.launch import start_fake

LATENCY_MS = 50
PARALLEL = 4
TENANTS = "t0,t1,t2,t3"
PROBE_RATE = 20.0
RATE_LIMIT_SHARE = 1.2  # runner B lets the tenants together pass this x saturation
_MARK = "BENCH_JSON "


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@contextlib.contextmanager
def start_runner(
    engine_url: str,
    env_extra: dict[str, str],
    code_dir: Path,
    frozen_gc: bool = False,
    timeout: float = 30.0,
) -> Iterator[RunnerProc]:
    """`python -m runner` attached to `engine_url` as `echo` at `parallel: 4`, with `env_extra`.

    (`bench.proxy.procs.start_runner` fixes its limits; this bench needs to set them.)
    """
    with tempfile.TemporaryDirectory(prefix="bench-overload-") as tmp:
        models = Path(tmp) / "models.yaml"
        models.write_text(
            "models:\n  - id: echo\n    backend: openai\n"
            f"    url: {engine_url}\n    parallel: {PARALLEL}\n"
        )
        port = free_port()
        env = {
            "MODELS_CONFIG": str(models),
            "HOST": "127.0.0.1",
            "PORT": str(port),
            "LOG_LEVEL": "info",
            "LOG_FORMAT": "text",
            "ENABLE_METRICS": "true",
            "ENABLE_MULTI_TENANT": "true",
            **env_extra,
        }
        drop = ("REDIS_URL", "DEFAULT_RATE_LIMIT", "MAX_QUEUE_DEPTH", "QUEUE_TIMEOUT_MS")
        full_env = {
            k: v
            for k, v in os.environ.items()
            if k not in drop and not k.startswith("TENANT_RATE_LIMIT_")
        }
        full_env.update(env)
        module = "runner"
        if frozen_gc:  # the launcher lives in bench/, the runner's packages stay code_dir's
            module = "bench.overload.frozen_runner"
            full_env["PYTHONPATH"] = str(REPO_ROOT)
        log_path = Path(tmp) / "runner.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", module],
                cwd=code_dir,
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                try:
                    _wait_healthy(proc, f"http://127.0.0.1:{port}", timeout)
                except StartError as exc:
                    tail = log_path.read_bytes()[-3000:].decode(errors="replace")
                    raise StartError(f"{exc}\n--- runner output ---\n{tail}") from None
                yield RunnerProc(proc, port, {k: v for k, v in env.items() if k != "MODELS_CONFIG"})
            finally:
                _kill_group(proc)


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


def _loadgen_cmd(url: str, duration: float, warmup: float, *extra: str) -> list[str]:
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


def closed(
    url: str, clients: int, args: argparse.Namespace, watch: dict[str, int]
) -> dict[str, Any]:
    cmd = _loadgen_cmd(url, args.sat_duration, 1.0, "--mode", "closed")
    cmd += ["--concurrency", str(clients), "--tenants", TENANTS]
    (res,), cpu = run_load([cmd], args.sat_duration, watch)
    res["usage"] = cpu
    return res


def overload(
    runner: RunnerProc,
    null: RunnerProc,
    rate: float,
    args: argparse.Namespace,
    watch: dict[str, int],
    seed: int,
) -> dict[str, Any]:
    """Main Poisson load at `rate - PROBE_RATE` plus the constant-rate probe at PROBE_RATE;
    beside them a second probe times the null server (not part of the offered load)."""
    main = _loadgen_cmd(runner.url, args.duration, args.warmup, "--mode", "open")
    main += ["--rate", f"{rate - PROBE_RATE:.2f}", "--tenants", TENANTS, "--seed", str(seed)]
    probe = _loadgen_cmd(runner.url, args.duration, args.warmup, "--mode", "open")
    probe += ["--rate", f"{PROBE_RATE:g}", "--arrivals", "constant", "--tenants", "probe"]
    probe += ["--preopen", "4"]
    floor = _loadgen_cmd(null.url, args.duration, args.warmup, "--mode", "open")
    floor += ["--rate", f"{PROBE_RATE:g}", "--arrivals", "constant", "--tenants", "probe"]
    floor += ["--preopen", "4"]
    load0 = loadavg()
    (m, p, f), usage = run_load([main, probe, floor], args.duration, watch)
    return {
        "offered_rate": rate,
        "main": m,
        "probe": p,
        "null_probe": f,
        "usage": usage,
        "loadavg_before": load0,
    }


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="P4: refusal cost and goodput at 2x overload")
    p.add_argument("--duration", type=float, default=20.0, help="seconds per overload run")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds left out of each run")
    p.add_argument("--sat-duration", type=float, default=10.0, help="seconds per saturation run")
    p.add_argument("--reps", type=int, default=3, help="repetitions of sat + (a) + (b)")
    p.add_argument("--quick", action="store_true", help="6 s runs, 1 repetition")
    p.add_argument("--ref", default=None, help="run the runner from this commit's packages")
    p.add_argument(
        "--frozen-gc",
        action="store_true",
        help="experiment: start the runners with gc.freeze() after imports (frozen_runner.py)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.warmup, args.sat_duration, args.reps = 6.0, 2.0, 4.0, 1
    if not 5 <= args.duration <= 120 or args.warmup >= args.duration:
        p.error("--duration must be 5-120 s and longer than --warmup")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    started = datetime.now(UTC)
    result: dict[str, Any] = {
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "command": ".venv/bin/python -m bench.overload.run " + " ".join(sys.argv[1:]),
        "args": vars(args),
        "machine": machine_facts(),
        "tested_code": f"commit {resolve_ref(args.ref)}" if args.ref else "work tree",
        "runner_launch": "bench.overload.frozen_runner" if args.frozen_gc else "runner",
        "engine": {"latency_ms": LATENCY_MS, "parallel": PARALLEL},
        "loadavg_before": loadavg(),
        "reps": [],
    }
    _log(f"load average before: {result['loadavg_before']}")
    try:
        with (
            code_snapshot(args.ref) as code_dir,
            start_fake("fake_openai", "--latency-ms", str(LATENCY_MS)) as engine,
            start_runner(engine.url, {}, code_dir, args.frozen_gc) as ra,
            start_null_server() as null,
        ):
            watch = {"engine": engine.proc.pid, "runner": ra.proc.pid}
            _log(f"engine pid {engine.proc.pid}, runner A pid {ra.proc.pid} ({ra.url})")
            direct = closed(engine.url, PARALLEL, args, watch)
            sat4 = closed(ra.url, PARALLEL, args, watch)
            sat8 = closed(ra.url, 2 * PARALLEL, args, watch)
            sat0 = max(sat4["ok_per_s"], sat8["ok_per_s"])
            _log(
                f"saturation: direct c=4 {direct['ok_per_s']}, runner c=4 {sat4['ok_per_s']}, "
                f"c=8 {sat8['ok_per_s']} req/s"
            )
            per_tenant = max(1, round(RATE_LIMIT_SHARE * sat0 / len(TENANTS.split(","))))
            env_b = {
                "DEFAULT_RATE_LIMIT": f"{per_tenant}req/s",
                "TENANT_RATE_LIMIT_probe": "1req/hour",
            }
            result["saturation"] = {"direct_c4": direct, "runner_c4": sat4, "runner_c8": sat8}
            result["runner_env"] = {"A": ra.env}
            with start_runner(engine.url, env_b, code_dir, args.frozen_gc) as rb:
                result["runner_env"]["B"] = rb.env
                _log(f"runner B pid {rb.proc.pid}: DEFAULT_RATE_LIMIT={per_tenant}req/s")
                idle_cmd = _loadgen_cmd(rb.url, 6.0, 1.0, "--mode", "open", "--rate", "20")
                idle_cmd += ["--arrivals", "constant", "--tenants", "probe", "--preopen", "4"]
                (idle,), _ = run_load([idle_cmd], 6.0, {})
                result["idle_429"] = idle
                _log(f"idle 429 floor: {idle['latency_ms']}")
                for rep in range(args.reps):
                    sat = closed(ra.url, 2 * PARALLEL, args, watch)["ok_per_s"]
                    time.sleep(1.0)
                    row: dict[str, Any] = {"saturation": sat}
                    for name, runner in (("queue", ra), ("ratelimit", rb)):
                        w = {"engine": engine.proc.pid, "runner": runner.proc.pid}
                        w["null"] = null.proc.pid
                        row[name] = overload(runner, null, 2 * sat, args, w, seed=rep + 1)
                        time.sleep(1.0)
                        _log(report.one_line(rep, name, sat, row[name]))
                    result["reps"].append(row)
    except KeyboardInterrupt:
        _log("interrupted; engine and runners stopped")
        return 130
    result["loadavg_after"] = loadavg()
    result["summary"] = report.summarize(result)
    out_dir = REPO_ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"overload-{started.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=1))
    print("\n" + report.markdown(result) + "\n")
    _log(f"wrote {out.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
