"""P1-P3: the data path's cost, runner vs direct to the same fake engine, in one run.

    .venv/bin/python -m bench.proxy.run [--duration 10] [--reps 5] [--quick] [--ref HEAD]
        [--no-ttfb] [--docs | --no-docs] [--from-json FILE]

What it does:
1. starts one fake OpenAI engine (`tests.fixtures.fake_openai`, 20 ms latency; streams
   20 chunks x 5 ms) and one runner attached to it (`python -m runner`, all features on:
   metrics, `DEFAULT_RATE_LIMIT=100000000req/min`, requests carry `X-Tenant-ID` and
   `X-Priority`), each its own process, both on 127.0.0.1 only;
2. for each of {json, stream} x {16, 64} clients: a warm-up of each side, then `--reps`
   interleaved pairs of `wrk` runs, direct and through the runner, the order alternating
   per pair (D R, R D, ...) so a slow drift of the shared machine's load hits both sides;
   before each pair it waits (at most `--quiet-wait` s) until other jobs use fewer than
   `--quiet-below` cores, and records how busy the rest of the machine was during each run;
3. streaming time to first chunk at 16 clients, with the asyncio client `bench.proxy.ttfb`,
   interleaved the same way (skip with `--no-ttfb`);
4. writes `bench/results/proxy-<time>.json` and, unless `--quick` (or `--no-docs`),
   rewrites the generated block of the "Data path (P1-P3)" section of docs/benchmarks.md
   (`--from-json <file>` re-renders that block from a saved result, measuring nothing).

`--ref <commit>` runs the runner from that commit's packages (`git archive`) instead of the
work tree, so half-finished edits in a shared work tree stay out of the figures.

Every run has a bounded duration; the engine and runner are killed with their process
groups on exit, Ctrl-C or SIGTERM included. `wrk` must be installed (apt-get install -y wrk).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from bench.proxy import report
from bench.proxy.loadgen import run_ttfb, run_wrk
from bench.proxy.procs import (
    REPO_ROOT,
    RunnerProc,
    code_snapshot,
    loadavg,
    machine_facts,
    require_wrk,
    resolve_ref,
    start_runner,
    wait_quiet,
)
from tests.fixtures.launch import FakeEngine, start_fake

LATENCY_MS, CHUNKS, CHUNK_DELAY_MS = 20, 20, 5
PATH = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "Say hello to the benchmark, please."}]
BODIES = {
    "json": {"model": "echo", "messages": MESSAGES, "max_tokens": 32},
    "stream": {
        "model": "echo",
        "messages": MESSAGES,
        "stream": True,
        "stream_options": {"include_usage": True},
    },
}
CLIENTS = (16, 64)


def ceiling_rps(kind: str, clients: int) -> float:
    """Closed-loop upper bound: clients / the engine's fixed time per request."""
    per_request_s = (LATENCY_MS + (CHUNKS * CHUNK_DELAY_MS if kind == "stream" else 0)) / 1e3
    return clients / per_request_s


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def probe(runner: RunnerProc) -> dict[str, Any]:
    """One request through the runner: which response headers show the features at work."""
    req = urllib.request.Request(
        runner.url + PATH,
        data=json.dumps(BODIES["json"]).encode(),
        headers={
            "Content-Type": "application/json",
            "X-Tenant-ID": "bench-tenant",
            "X-Priority": "normal",
        },
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        names = sorted({k.lower() for k in resp.headers})
        status = resp.status
    return {
        "status": status,
        "response_headers": names,
        "rate_limit_headers": any(n.startswith("ratelimit-") for n in names),
    }


def metrics_count(runner: RunnerProc) -> float:
    """Sum of the runner's request counters for the bench tenant (shows metrics were on)."""
    with urllib.request.urlopen(runner.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or 'tenant="bench-tenant"' not in line:
            continue
        name = line.split("{", 1)[0]
        if name.endswith("_total") and "request" in name:
            total += float(line.rsplit(" ", 1)[1])
    return total


def run_row(
    engine: FakeEngine, runner: RunnerProc, kind: str, clients: int, args: argparse.Namespace
) -> dict[str, Any]:
    body = json.dumps(BODIES[kind]).encode()
    urls = {"direct": engine.url + PATH, "runner": runner.url + PATH}
    watch = {"engine": engine.proc.pid, "runner": runner.proc.pid}
    load0 = loadavg()
    for side in ("direct", "runner"):
        run_wrk(urls[side], body, clients, args.warmup)
    pairs = []
    for i in range(args.reps):
        order = ("direct", "runner") if i % 2 == 0 else ("runner", "direct")
        quiet = wait_quiet(watch, args.quiet_below, args.quiet_wait)
        if quiet["waited_s"] > 1.5:
            _log(
                f"waited {quiet['waited_s']:g} s for quiet (others: {quiet['others_cores']} cores)"
            )
        pair = {side: run_wrk(urls[side], body, clients, args.duration, watch) for side in order}
        d, r = pair["direct"], pair["runner"]
        _log(
            f"{kind:6} c={clients:<3} pair {i + 1}/{args.reps}: direct {d['rps']:7.1f} req/s "
            f"p50 {d['lat_p50_us'] / 1e3:6.2f} ms | runner {r['rps']:7.1f} req/s "
            f"p50 {r['lat_p50_us'] / 1e3:6.2f} ms | ratio {r['rps'] / d['rps']:.3f} "
            f"errors {d['errors']}/{r['errors']}"
        )
        pairs.append({"order": list(order), "quiet": quiet, **pair})
    summary = report.summarize_pairs(pairs)
    return {
        "kind": kind,
        "clients": clients,
        "ceiling_rps": ceiling_rps(kind, clients),
        "loadavg_before": load0,
        "loadavg_after": loadavg(),
        "summary": summary,
        "verdict": report.verdicts(kind, clients, summary),
        "pairs": pairs,
    }


def run_ttfb_rows(
    engine: FakeEngine, runner: RunnerProc, args: argparse.Namespace
) -> dict[str, Any]:
    body = json.dumps(BODIES["stream"]).encode()
    urls = {"direct": engine.url + PATH, "runner": runner.url + PATH}
    clients = 16
    for side in ("direct", "runner"):
        run_ttfb(urls[side], body, clients, args.warmup)
    pairs: list[dict[str, Any]] = []
    for i in range(args.reps):
        order = ("direct", "runner") if i % 2 == 0 else ("runner", "direct")
        pair = {side: run_ttfb(urls[side], body, clients, args.duration) for side in order}
        d, r = pair["direct"], pair["runner"]
        _log(
            f"ttfb   c=16  pair {i + 1}/{args.reps}: direct p50/p99 "
            f"{d['ttfb_p50_us'] / 1e3:.2f}/{d['ttfb_p99_us'] / 1e3:.2f} ms | runner "
            f"{r['ttfb_p50_us'] / 1e3:.2f}/{r['ttfb_p99_us'] / 1e3:.2f} ms "
            f"({d['requests']}/{r['requests']} streams)"
        )
        pairs.append({"order": list(order), **pair})
    return {
        "clients": clients,
        "summary": report.summarize_ttfb(pairs),
        "events_direct": sorted({e for p in pairs for e in p["direct"]["events_per_response"]}),
        "events_runner": sorted({e for p in pairs for e in p["runner"]["events_per_response"]}),
        "pairs": pairs,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="runner vs direct data-path benchmark (P1-P3)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per run (default 10)")
    p.add_argument("--reps", type=int, default=5, help="interleaved pairs per row (default 5)")
    p.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per side")
    p.add_argument("--quick", action="store_true", help="2 s runs, 2 pairs; docs untouched")
    p.add_argument(
        "--ref",
        default=None,
        help="run the runner from this commit's packages (e.g. HEAD) instead of the work tree",
    )
    p.add_argument(
        "--quiet-below",
        type=float,
        default=0.5,
        help="before each pair, wait until other jobs use fewer cores than this (default 0.5)",
    )
    p.add_argument(
        "--quiet-wait", type=float, default=30.0, help="wait at most this long (s) for quiet"
    )
    p.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="measure nothing: re-render the docs block from a saved result",
    )
    p.add_argument("--no-ttfb", action="store_true", help="skip the time-to-first-chunk client")
    docs = p.add_mutually_exclusive_group()
    docs.add_argument("--docs", dest="docs", action="store_true", default=None)
    docs.add_argument("--no-docs", dest="docs", action="store_false")
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.reps, args.warmup = 2.0, 2, 1.0
    if args.docs is None:
        args.docs = not args.quick
    return args


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    docs = REPO_ROOT / "docs" / "benchmarks.md"
    if args.from_json is not None:
        report.write_docs(docs, report.markdown(json.loads(args.from_json.read_text())))
        _log(f"rewrote the Data path (P1-P3) block in docs/benchmarks.md from {args.from_json}")
        return 0
    require_wrk()
    signal.signal(signal.SIGTERM, _sigterm)
    started = datetime.now(UTC)
    result: dict[str, Any] = {
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "command": ".venv/bin/python -m bench.proxy.run " + " ".join(sys.argv[1:]),
        "duration_s": args.duration,
        "reps": args.reps,
        "warmup_s": args.warmup,
        "quiet_below": args.quiet_below,
        "quiet_wait_s": args.quiet_wait,
        "machine": machine_facts(),
        "tested_code": f"commit {resolve_ref(args.ref)}" if args.ref else "work tree",
        "loadavg_before": loadavg(),
        "engine": {"latency_ms": LATENCY_MS, "chunks": CHUNKS, "chunk_delay_ms": CHUNK_DELAY_MS},
        "bodies": BODIES,
        "rows": [],
    }
    _log(f"load average before: {result['loadavg_before']}")
    fake_args = ["--latency-ms", str(LATENCY_MS), "--chunks", str(CHUNKS)]
    fake_args += ["--chunk-delay-ms", str(CHUNK_DELAY_MS)]
    try:
        with (
            code_snapshot(args.ref) as code_dir,
            start_fake("fake_openai", *fake_args) as engine,
            start_runner(engine.url, max(CLIENTS), code_dir) as runner,
        ):
            _log(
                f"engine {engine.url} (pid {engine.proc.pid}), runner {runner.url} "
                f"(pid {runner.proc.pid})"
            )
            result["runner_env"] = runner.env
            result["probe"] = probe(runner)
            for kind in ("json", "stream"):
                for clients in CLIENTS:
                    result["rows"].append(run_row(engine, runner, kind, clients, args))
            if not args.no_ttfb:
                result["ttfb"] = run_ttfb_rows(engine, runner, args)
            result["metrics_bench_tenant_requests"] = metrics_count(runner)
    except KeyboardInterrupt:
        _log("interrupted; engine and runner stopped")
        return 130
    result["loadavg_after"] = loadavg()
    _log(f"load average after: {result['loadavg_after']}")
    out_dir = REPO_ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"proxy-{started.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=1))
    generated = report.markdown(result)
    print("\n" + generated + "\n")
    _log(f"wrote {out.relative_to(REPO_ROOT)}")
    if args.docs:
        report.write_docs(docs, generated)
        _log("rewrote the Data path (P1-P3) block in docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
