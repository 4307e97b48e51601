"""(a) The data path's cost of tenant policy: budgets, entitlements, priority ceilings and
in-flight caps on (8 tenants, each with two token budgets) against the same runner with
no tenant policy, on bench/proxy's load, interleaved in one run.

    .venv/bin/python -m bench.tenants.datapath [--duration 8] [--reps 6] [--kinds json,stream]
        [--clients 16] [--ref HEAD] [--redis] [--docs]

One fake engine (bench/proxy's: 20 ms, 20 stream chunks x 5 ms) and two runners from the
same code (`--ref`'s packages, `git archive`; default HEAD): `off` with bench/proxy's
limits only, `on` with a tenants file declaring 8 tenants that each have an entitlement
list, a priority default and ceiling, an in-flight cap (64: checked on every grant, never
binding at these loads) and two token budgets (a total per minute and an output per day,
large enough never to refuse, so every request reserves and settles). `wrk` sends each
request as the next of the 8 tenants in turn (`BENCH_TENANTS`, bench/proxy/wrk.lua), on
every side. Per row (kind x clients), `--reps` rounds of three `wrk` runs (direct, off, on),
the order rotating per round so the shared machine's drift hits all three alike; per round
`on ÷ off` throughput and `on - off` p50, medians over rounds with [min, max]. Targets
(issue 26): on ÷ off >= 0.98 and on - off p50 <= +0.1 ms at 16 clients. `--redis`: both
runners on one throwaway Redis (the budgets' store is then Redis: one round trip to
reserve, one to settle).

Writes `bench/results/tenants-datapath-<time>.json`; with `--docs`, the generated block of
the "Tenant policy (issue 26)" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from bench.proxy.loadgen import run_wrk
from bench.proxy.procs import (
    FEATURES_ON,
    RunnerProc,
    code_snapshot,
    loadavg,
    machine_facts,
    require_wrk,
    resolve_ref,
    start_runner,
    targets_of,
    wait_quiet,
)
from bench.proxy.report import spread, summarize_pairs
from bench.proxy.run import BODIES, CHUNK_DELAY_MS, CHUNKS, LATENCY_MS, PATH
from bench.tenants.common import log, save, write_block
from tests.fixtures.launch import start_fake
from tests.support.redis_server import RedisServer

SIDES = ("direct", "off", "on")
TENANTS = [f"team-{i}" for i in range(8)]
BIG = 10**12


def tenants_file() -> str:
    """8 tenants, each with every policy field set (none refuses at these loads)."""
    lines = ["tenants:"]
    for tenant in TENANTS:
        lines += [
            f"  {tenant}:",
            '    models: ["echo", "gemma-*"]',
            "    priority: {default: normal, max: high}",
            "    max_in_flight: 64",
            "    token_budgets:",
            f"      - {{tokens: {BIG}, per: minute}}",
            f"      - {{tokens: {BIG}, per: day, count: output, model: echo}}",
        ]
    return "\n".join(lines) + "\n"


def rotation(i: int) -> tuple[str, ...]:
    k = i % len(SIDES)
    return SIDES[k:] + SIDES[:k]


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        side: summarize_pairs([{"direct": r["direct"], "runner": r[side]} for r in rounds])
        for side in ("off", "on")
    }
    out["on_over_off"] = spread([r["on"]["rps"] / r["off"]["rps"] for r in rounds])
    out["on_minus_off_p50_ms"] = spread(
        [(r["on"]["lat_p50_us"] - r["off"]["lat_p50_us"]) / 1e3 for r in rounds]
    )
    return out


def check_sides(urls: dict[str, str]) -> None:
    """Before measuring: `on` applies the policy (its answers carry the token budget's
    headers), `off` does not; a bench that measured two equal runners would say nothing."""
    body = json.dumps(BODIES["json"]).encode()
    for side, wanted in (("off", False), ("on", True)):
        request = urllib.request.Request(
            urls[side], body, {"Content-Type": "application/json", "X-Tenant-ID": TENANTS[0]}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            budgeted = answer.headers.get("x-ratelimit-remaining-tokens") is not None
        if budgeted is not wanted:
            raise SystemExit(f"the {side} runner's answers do not show its tenant policy")


def run_row(
    urls: dict[str, str],
    watch: dict[str, dict[str, int]],
    kind: str,
    clients: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    body = json.dumps(BODIES[kind]).encode()
    for side in SIDES:
        run_wrk(urls[side], body, clients, args.warmup)
    rounds: list[dict[str, Any]] = []
    for i in range(args.reps):
        order = rotation(i)
        wait_quiet(watch["all"], args.quiet_below, args.quiet_wait)
        one = {
            side: run_wrk(urls[side], body, clients, args.duration, watch[side]) for side in order
        }
        d, off, on = one["direct"], one["off"], one["on"]
        log(
            f"{kind:6} c={clients:<3} round {i + 1}/{args.reps}: direct {d['rps']:7.1f} "
            f"off {off['rps']:7.1f} on {on['rps']:7.1f} (on/off {on['rps'] / off['rps']:.3f}) "
            f"| p50 ms {d['lat_p50_us'] / 1e3:.2f} / {off['lat_p50_us'] / 1e3:.2f} / "
            f"{on['lat_p50_us'] / 1e3:.2f} | errors {off['errors']} / {on['errors']}"
        )
        rounds.append({"order": list(order), **one})
    return {"kind": kind, "clients": clients, "summary": summarize(rounds), "rounds": rounds}


def _f(s: dict[str, float], digits: int = 3, signed: bool = False) -> str:
    fmt = f"{{:{'+' if signed else ''}.{digits}f}}"
    return f"{fmt.format(s['median'])} [{fmt.format(s['min'])}, {fmt.format(s['max'])}]"


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Run {result['started']}, commit {result['ref']}"
        f"{', Redis stores' if result['redis'] else ', embedded stores'}. Command:",
        "",
        f"    {result['command']}",
        "",
        f"Machine: {result['machine']['nproc']} cores ({result['machine']['cpu']}), load "
        f"average before {result['loadavg_before']}, after {result['loadavg_after']}. "
        f"{result['reps']} rounds of three {result['duration_s']:g} s `wrk` runs per row "
        "(direct, off, on; the order rotating), medians over rounds, [min, max]. Targets: "
        "on ÷ off >= 0.98, on - off p50 <= +0.1 ms at 16 clients.",
        "",
        "| load | clients | off ÷ direct | on ÷ direct | on ÷ off | on - off p50 (ms) | "
        "runner CPU/req off → on (µs) | errors | target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in result["rows"]:
        s = row["summary"]
        off, on = s["off"], s["on"]
        met = s["on_over_off"]["median"] >= 0.98 and s["on_minus_off_p50_ms"]["median"] <= 0.1
        lines.append(
            f"| {row['kind']} | {row['clients']} | {_f(off['ratio'])} | {_f(on['ratio'])} | "
            f"{_f(s['on_over_off'])} | {_f(s['on_minus_off_p50_ms'], 2, True)} | "
            f"{off['runner_cpu_us_per_req']['median']:.0f} → "
            f"{on['runner_cpu_us_per_req']['median']:.0f} | {off['errors'] + on['errors']} | "
            f"{'met' if met else 'missed'} |"
        )
    return "\n".join(lines)


@contextlib.contextmanager
def _runners(engine_url: str, ref: str, redis: bool) -> Iterator[dict[str, RunnerProc]]:
    with contextlib.ExitStack() as stack:
        code = stack.enter_context(code_snapshot(ref, ("faults",)))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-tenants-")))
        (tmp / "tenants.yaml").write_text(tenants_file())
        base = dict(FEATURES_ON)
        if redis:
            server = RedisServer().start()
            stack.callback(server.stop)
            base["REDIS_URL"] = server.url
        envs = {
            "off": {**base, "USAGE_DB": str(tmp / "usage-off.sqlite3")},
            "on": {
                **base,
                "USAGE_DB": str(tmp / "usage-on.sqlite3"),
                "TENANTS_FILE": str(tmp / "tenants.yaml"),
            },
        }
        yield {
            side: stack.enter_context(start_runner(engine_url, 64, code, env=env))
            for side, env in envs.items()
        }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="tenant policy's data-path cost, on vs off")
    p.add_argument("--ref", default="HEAD", help="the commit whose packages both runners run")
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--kinds", default="json,stream")
    p.add_argument("--clients", default="16")
    p.add_argument("--quiet-below", type=float, default=0.5)
    p.add_argument("--quiet-wait", type=float, default=20.0)
    p.add_argument("--redis", action="store_true", help="both runners' stores in one Redis")
    p.add_argument("--docs", action="store_true", help="rewrite the docs/benchmarks.md block")
    return p.parse_args(argv)


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    require_wrk()
    signal.signal(signal.SIGTERM, _sigterm)
    started = datetime.now(UTC)
    os.environ["BENCH_TENANTS"] = ",".join(TENANTS)  # read by wrk.lua, every side alike
    result: dict[str, Any] = {
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "command": ".venv/bin/python -m bench.tenants.datapath " + " ".join(sys.argv[1:]),
        "ref": resolve_ref(args.ref),
        "redis": args.redis,
        "duration_s": args.duration,
        "reps": args.reps,
        "machine": machine_facts(),
        "loadavg_before": loadavg(),
        "rows": [],
    }
    fake = ["--latency-ms", str(LATENCY_MS), "--chunks", str(CHUNKS)]
    fake += ["--chunk-delay-ms", str(CHUNK_DELAY_MS)]
    try:
        with (
            start_fake("fake_openai", *fake) as engine,
            _runners(engine.url, result["ref"], args.redis) as runners,
        ):
            urls, watch = targets_of(engine.url, engine.proc.pid, runners, PATH)
            pids = watch["all"]
            log(f"engine {engine.proc.pid}, runners off {pids['off']}, on {pids['on']}")
            check_sides(urls)
            for kind in args.kinds.split(","):
                for clients in (int(c) for c in args.clients.split(",")):
                    result["rows"].append(run_row(urls, watch, kind, clients, args))
    except KeyboardInterrupt:
        log("interrupted; engine and runners stopped")
        return 130
    result["loadavg_after"] = loadavg()
    save("datapath", started, result)
    generated = markdown(result)
    print("\n" + generated + "\n")
    if args.docs:
        write_block("datapath", generated)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
