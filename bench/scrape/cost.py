"""What one scrape of the runner's metrics costs it, two code versions side by side.

    .venv/bin/python -m bench.scrape.cost [--before REF] [--after REF] [--rounds 20]
        [--paths /metrics,/metrics/picker]

Starts one fake engine and two runners on it, one from each commit (`git archive`), gives
both the same load first (`wrk`, 64 clients, so their series and the queue's wait window
are filled as in service), then, with no load, alternates batches of `GET` of each of
`--paths` it serves (a runner from before `/metrics/picker` serves `/metrics` only, which
then carries the picker's family) and `GET /health` between them and reads each runner's
CPU time around every batch. A scrape's cost is its paths' together. Medians over the
rounds. Both runners see the same machine at the same moments, so the noise of a
shared machine hits both: compare the two columns, and read the absolute figures as this
machine's at this time.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import statistics
import sys
from contextlib import ExitStack
from typing import Any
from urllib.parse import urlsplit

from bench.proxy.loadgen import run_wrk
from bench.proxy.procs import (
    RunnerProc,
    code_snapshot,
    cpu_seconds,
    loadavg,
    require_wrk,
    resolve_ref,
    start_runner,
)
from bench.scrape.run import BODY, DEFAULT_PATHS, PATH, served_paths
from tests.fixtures.launch import start_fake


def batch_cpu_us(runner: RunnerProc, conn: http.client.HTTPConnection, path: str, n: int) -> float:
    """The runner's CPU per request over `n` back-to-back `GET path` (µs)."""
    before = cpu_seconds(runner.proc.pid)
    for _ in range(n):
        conn.request("GET", path)
        conn.getresponse().read()
    return (cpu_seconds(runner.proc.pid) - before) / n * 1e6


def measure(args: argparse.Namespace) -> dict[str, Any]:
    refs = {"before": args.before, "after": args.after}
    with ExitStack() as stack:
        engine = stack.enter_context(start_fake("fake_openai", "--latency-ms", "20"))
        runners = {
            side: stack.enter_context(
                start_runner(engine.url, 64, stack.enter_context(code_snapshot(ref)))
            )
            for side, ref in refs.items()
        }
        for runner in runners.values():
            run_wrk(runner.url + PATH, json.dumps(BODY).encode(), 64, args.load_s)
        conns = {
            side: http.client.HTTPConnection(urlsplit(r.url).hostname or "", urlsplit(r.url).port)
            for side, r in runners.items()
        }
        wanted = tuple(p for p in args.paths.split(",") if p)
        paths = {side: served_paths(r.url, wanted) for side, r in runners.items()}
        sizes = {}
        for side, conn in conns.items():
            sizes[side] = 0
            for path in paths[side]:
                conn.request("GET", path)
                sizes[side] += len(conn.getresponse().read())
        samples: dict[str, dict[str, list[float]]] = {
            side: {path: [] for path in (*paths[side], "/health")} for side in runners
        }
        for i in range(args.rounds):
            order = list(runners) if i % 2 == 0 else list(reversed(runners))
            for side in order:
                for path in samples[side]:
                    cost = batch_cpu_us(runners[side], conns[side], path, args.batch)
                    samples[side][path].append(cost)
    return {
        side: {
            "metrics_cpu_us": sum(statistics.median(s[p]) for p in paths[side]),
            "metrics_cpu_us_by_path": {p: statistics.median(s[p]) for p in paths[side]},
            "health_cpu_us": statistics.median(s["/health"]),
            "metrics_bytes": sizes[side],
        }
        for side, s in samples.items()
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="CPU per metrics scrape, two commits")
    p.add_argument("--before", required=True, help="commit of the first runner")
    p.add_argument("--after", default="HEAD", help="commit of the second runner")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--batch", type=int, default=50, help="requests per batch")
    p.add_argument("--load-s", type=float, default=3.0, help="load given to each first")
    p.add_argument("--rate", type=float, default=20.0, help="scrapes/s for the share figure")
    p.add_argument("--paths", default=DEFAULT_PATHS, help="read at each scrape, if served")
    args = p.parse_args(argv)
    require_wrk()
    load0 = loadavg()
    result = measure(args)
    print(
        "BENCH_RESULT "
        + json.dumps(
            {
                "command": ".venv/bin/python -m bench.scrape.cost " + " ".join(sys.argv[1:]),
                "refs": {"before": resolve_ref(args.before), "after": resolve_ref(args.after)},
                "loadavg": [load0, loadavg()],
                **result,
            }
        )
    )
    for side, r in result.items():
        share = args.rate * r["metrics_cpu_us"] / 1e6
        by_path = ", ".join(f"{p} {us:.0f}" for p, us in r["metrics_cpu_us_by_path"].items())
        print(
            f"{side:6} ({resolve_ref(getattr(args, side))}): {r['metrics_cpu_us']:.0f} µs of CPU "
            f"per scrape ({by_path}; {r['metrics_bytes']} bytes), {r['health_cpu_us']:.0f} µs "
            "per /health; "
            f"{args.rate:g} scrapes/s = {100 * share:.2f}% of a core"
        )
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
