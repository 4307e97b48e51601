"""P4: what a refusal costs through HTTP at 2x overload, and whether goodput holds.

    .venv/bin/python -m bench.overload.run [--duration 20] [--reps 3] [--quick] [--ref HEAD]
        [--server-timing] [--frozen-gc]

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

Experiments (both run the runner through `bench.overload.instrumented_runner`):
`--server-timing` also times each request inside the runner (data path call to return), to
tell the runner's own code from what uvicorn, the kernel and the client add;
`--frozen-gc` calls `gc.freeze()` after the runner's imports, to measure what the garbage
collector's full collections cost the tail.

Goodput is 200 answers per second over the measured window (warm-up left out) divided by
the saturation measured in the same repetition. Refusal latency is timed by the client from
writing the request to the end of the answer. Targets: refusals <= 2 ms p99, goodput
>= 0.95x saturation.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from bench.overload import report
from bench.overload.procs import loadgen_cmd, run_load, start_null_server, start_runner
from bench.overload.samples import latency_ms
from bench.proxy.procs import (
    REPO_ROOT,
    RunnerProc,
    code_snapshot,
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


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def closed(
    url: str, clients: int, args: argparse.Namespace, watch: dict[str, int]
) -> dict[str, Any]:
    cmd = loadgen_cmd(url, args.sat_duration, 1.0, "--mode", "closed")
    cmd += ["--concurrency", str(clients), "--tenants", TENANTS]
    results, cpu = run_load([cmd], args.sat_duration, watch)
    res = results[0]
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
    main = loadgen_cmd(runner.url, args.duration, args.warmup, "--mode", "open")
    main += ["--rate", f"{rate - PROBE_RATE:.2f}", "--tenants", TENANTS, "--seed", str(seed)]
    probe = loadgen_cmd(runner.url, args.duration, args.warmup, "--mode", "open")
    probe += ["--rate", f"{PROBE_RATE:g}", "--arrivals", "constant", "--tenants", "probe"]
    probe += ["--preopen", "4"]
    floor = loadgen_cmd(null.url, args.duration, args.warmup, "--mode", "open")
    floor += ["--rate", f"{PROBE_RATE:g}", "--arrivals", "constant", "--tenants", "probe"]
    floor += ["--preopen", "4"]
    load0 = loadavg()
    wall0 = time.time()
    (m, p, f), usage = run_load([main, probe, floor], args.duration, watch)
    return {
        "wall_window": [wall0 + args.warmup, wall0 + args.duration],
        "offered_rate": rate,
        "main": m,
        "probe": p,
        "null_probe": f,
        "usage": usage,
        "loadavg_before": load0,
    }


def measure(
    args: argparse.Namespace,
    result: dict[str, Any],
    code_dir: Path,
    timing: dict[str, Path | None],
) -> None:
    """Steps 1-4 of the module docstring; fills `result` in place."""
    with (
        start_fake("fake_openai", "--latency-ms", str(LATENCY_MS)) as engine,
        start_runner(engine.url, PARALLEL, {}, code_dir, args.frozen_gc, timing["A"]) as ra,
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
        with start_runner(engine.url, PARALLEL, env_b, code_dir, args.frozen_gc, timing["B"]) as rb:
            result["runner_env"]["B"] = rb.env
            _log(f"runner B pid {rb.proc.pid}: DEFAULT_RATE_LIMIT={per_tenant}req/s")
            idle_cmd = loadgen_cmd(rb.url, 6.0, 1.0, "--mode", "open", "--rate", "20")
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


def server_figures(records: list[list[float]], window: list[float]) -> dict[str, Any]:
    """Per status, latency inside the runner of the requests that started in `window`."""
    by_status: dict[str, list[float]] = {}
    for wall, status, seconds in records:
        if window[0] <= wall < window[1]:
            by_status.setdefault(str(int(status)), []).append(seconds)
    return {k: latency_ms(v) for k, v in sorted(by_status.items())}


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
        help="experiment: start the runners with gc.freeze() after imports",
    )
    p.add_argument(
        "--server-timing",
        action="store_true",
        help="also time each request inside the runner (bench.overload.instrumented_runner)",
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
        "runner_launch": (
            "bench.overload.instrumented_runner"
            + (" (gc.freeze)" if args.frozen_gc else "")
            + (" (server timing)" if args.server_timing else "")
            if args.frozen_gc or args.server_timing
            else "runner"
        ),
        "engine": {"latency_ms": LATENCY_MS, "parallel": PARALLEL},
        "loadavg_before": loadavg(),
        "reps": [],
    }
    _log(f"load average before: {result['loadavg_before']}")
    try:
        with (
            tempfile.TemporaryDirectory(prefix="bench-overload-timing-") as tmp,
            code_snapshot(args.ref) as code_dir,
        ):
            timing = {n: Path(tmp) / f"{n}.json" if args.server_timing else None for n in "AB"}
            measure(args, result, code_dir, timing)
            for name, runner_name in (("queue", "A"), ("ratelimit", "B")):
                path = timing[runner_name]
                if path is not None:
                    records = json.loads(path.read_text()) if path.exists() else []
                    for row in result["reps"]:
                        row[name]["server"] = server_figures(records, row[name]["wall_window"])
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
