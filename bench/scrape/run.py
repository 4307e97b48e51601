"""Does scraping the runner's metrics as the endpoint picker does slow the runner down?

    .venv/bin/python -m bench.scrape.run [--duration 8] [--reps 6] [--clients 64]
        [--rate 20] [--paths /metrics,/metrics/picker] [--ref HEAD]

What it does:
1. starts one fake OpenAI engine (`tests.fixtures.fake_openai`, 20 ms per answer) and one
   runner attached to it (`python -m runner`, bench/proxy's settings: metrics, rate limiter
   and queue on), each its own process on 127.0.0.1;
2. `--reps` interleaved pairs of `wrk` runs of `--clients` keep-alive JSON clients through
   the runner, one run with nobody scraping and one with a scraper reading `--paths`
   `--rate` times a second on one keep-alive connection (the picker's 50 ms), the order
   alternating per pair so a drift of the shared machine's load hits both. A scrape reads
   every path, one after the other: by default `/metrics` and `/metrics/picker` (the
   picker's `vllm:*` family, PICKER_METRICS_PATH), together what `/metrics` alone carried
   before they were split, so figures of commits before and after compare; paths a
   runner does not serve (an older `--ref`) are left out, and said so;
3. prints, per pair and as medians, throughput with scrapes over without, the runner's CPU
   per request both ways, and each scrape's latency (p50, p99, max) and size, all paths
   together; the CPU of one scrape, per path too.

`--ref <commit>` runs the runner from that commit's packages (`git archive`), so edits in a
shared work tree stay out of the figures. Every run is bounded; engine and runner are
killed with their process groups on exit.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from bench.proxy.loadgen import run_wrk
from bench.proxy.procs import (
    code_snapshot,
    cpu_seconds,
    loadavg,
    machine_facts,
    require_wrk,
    resolve_ref,
    start_runner,
    wait_quiet,
)
from tests.fixtures.launch import start_fake

PATH = "/v1/chat/completions"
BODY = {"model": "echo", "messages": [{"role": "user", "content": "Hello, bench."}]}


DEFAULT_PATHS = "/metrics,/metrics/picker"


@dataclass
class Scraper:
    """Reads each of `paths` of `url` `rate` times a second on one keep-alive connection,
    on a fixed schedule (a slow scrape does not shift the next ones), until stopped; a
    scrape's latency and size are its paths' together."""

    url: str
    paths: tuple[str, ...]
    rate: float
    latencies_s: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    errors: int = 0
    cpu_s: float = 0.0  # the scraper thread's own CPU (it shares the machine's cores)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        parts = urlsplit(self.url)
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=5)
        cpu0 = time.thread_time()
        start = time.perf_counter()
        n = 0
        while not self._stop.is_set():
            delay = start + n / self.rate - time.perf_counter()
            if delay > 0 and self._stop.wait(delay):
                break
            n += 1
            t0 = time.perf_counter()
            size = 0
            try:
                for path in self.paths:
                    conn.request("GET", path)
                    answer = conn.getresponse()
                    size += len(answer.read())
                    if answer.status != 200:
                        self.errors += 1
            except (OSError, http.client.HTTPException):
                self.errors += 1
                conn.close()
                continue
            self.latencies_s.append(time.perf_counter() - t0)
            self.sizes.append(size)
        conn.close()
        self.cpu_s = time.thread_time() - cpu0


def served_paths(runner_url: str, paths: tuple[str, ...]) -> tuple[str, ...]:
    """The `paths` the runner answers 200 (a runner from before `/metrics/picker` has not
    that one: its `/metrics` carries the picker's family)."""
    with httpx.Client(base_url=runner_url, timeout=5) as client:
        return tuple(p for p in paths if client.get(p).status_code == 200)


def scrape_cpu_us(
    runner_url: str, pid: int, paths: tuple[str, ...], rounds: int = 10, n: int = 100
) -> dict[str, float]:
    """The runner's CPU per `GET` of each of `paths` and, for scale, per `GET /health`,
    with no other load (median over `rounds` of `n` back-to-back requests on one
    connection): what a scrape costs, apart from the noise of other jobs on a shared
    machine."""
    parts = urlsplit(runner_url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=5)
    per: dict[str, list[float]] = {path: [] for path in (*paths, "/health")}
    for _ in range(rounds):
        for path, samples in per.items():
            before = cpu_seconds(pid)
            for _ in range(n):
                conn.request("GET", path)
                conn.getresponse().read()
            samples.append((cpu_seconds(pid) - before) / n * 1e6)
    conn.close()
    return {path: statistics.median(samples) for path, samples in per.items()}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    body = json.dumps(BODY).encode()
    pairs: list[dict[str, Any]] = []
    scrape_lat: list[float] = []
    sizes: list[int] = []
    with (
        code_snapshot(args.ref) as code_dir,
        start_fake("fake_openai", "--latency-ms", "20") as engine,
        start_runner(engine.url, args.clients, code_dir) as runner,
    ):
        url = runner.url + PATH
        watch = {"engine": engine.proc.pid, "runner": runner.proc.pid}
        wanted = tuple(p for p in args.paths.split(",") if p)
        paths = served_paths(runner.url, wanted)
        if paths != wanted:
            _log(f"not served by this runner, left out: {sorted(set(wanted) - set(paths))}")
        run_wrk(url, body, args.clients, args.warmup)
        for i in range(args.reps):
            order = ("quiet", "scraped") if i % 2 == 0 else ("scraped", "quiet")
            wait_quiet(watch, args.quiet_below, args.quiet_wait)
            pair: dict[str, Any] = {"order": list(order)}
            for side in order:
                if side == "quiet":
                    pair[side] = run_wrk(url, body, args.clients, args.duration, watch)
                    continue
                with Scraper(runner.url, paths, args.rate) as scraper:
                    pair[side] = run_wrk(url, body, args.clients, args.duration, watch)
                scrape_lat += scraper.latencies_s
                sizes += scraper.sizes
                pair["scrapes"] = len(scraper.latencies_s)
                pair["scrape_errors"] = scraper.errors
                pair["scraper_cpu_s"] = round(scraper.cpu_s, 3)
                pair["scrape_p99_ms"] = round(_pct(scraper.latencies_s, 0.99) * 1e3, 2)
            q, s = pair["quiet"], pair["scraped"]
            pair["ratio"] = s["rps"] / q["rps"]
            _log(
                f"pair {i + 1}/{args.reps}: quiet {q['rps']:7.1f} req/s | scraped "
                f"{s['rps']:7.1f} req/s ({pair['scrapes']} scrapes, p99 "
                f"{pair['scrape_p99_ms']} ms) | ratio {pair['ratio']:.4f}"
            )
            pairs.append(pair)
        cost = scrape_cpu_us(runner.url, runner.proc.pid, paths)
    scrape_cpu = sum(cost[p] for p in paths)
    ratios = [p["ratio"] for p in pairs]
    quiet_cores = statistics.median(
        p["quiet"]["cpu_s"]["runner"] / (p["quiet"]["duration_us"] / 1e6) for p in pairs
    )
    scrape_cores = args.rate * scrape_cpu / 1e6

    def cpu_per_req(side: str) -> float:
        return statistics.median(  # type: ignore[no-any-return]
            1e6 * float(p[side]["cpu_s"]["runner"]) / max(1, p[side]["requests"]) for p in pairs
        )

    return {
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "rps_quiet_median": statistics.median(p["quiet"]["rps"] for p in pairs),
        "rps_scraped_median": statistics.median(p["scraped"]["rps"] for p in pairs),
        "runner_cpu_us_per_req": {"quiet": cpu_per_req("quiet"), "scraped": cpu_per_req("scraped")},
        "scrapes": len(scrape_lat),
        "scrapes_per_s": len(scrape_lat) / (args.reps * args.duration),
        "scrape_errors": sum(p["scrape_errors"] for p in pairs),
        "scrape_ms": {
            "p50": _pct(scrape_lat, 0.50) * 1e3,
            "p99": _pct(scrape_lat, 0.99) * 1e3,
            "max": max(scrape_lat) * 1e3,
        },
        "scrape_paths": list(paths),
        "scrape_bytes": statistics.median(sizes),
        "scrape_cpu_us": scrape_cpu,
        "scrape_cpu_us_by_path": {p: cost[p] for p in paths},
        "health_cpu_us": cost["/health"],
        "scrape_cores": scrape_cores,  # CPU the scrapes take, in cores
        "scraper_cores": statistics.median(p["scraper_cpu_s"] for p in pairs) / args.duration,
        "runner_cores_under_load": quiet_cores,
        # throughput lost if the runner's one event-loop thread were the bottleneck
        "bound_runner_bound": scrape_cores,
        "other_cores_median": statistics.median(
            p[s]["other_cores"] for p in pairs for s in ("quiet", "scraped")
        ),
        "errors": sum(p[s]["errors"] for p in pairs for s in ("quiet", "scraped")),
        "pairs": pairs,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="metrics scrapes during load (issue 18)")
    p.add_argument("--duration", type=float, default=8.0, help="seconds per run (default 8)")
    p.add_argument("--reps", type=int, default=6, help="interleaved pairs (default 6)")
    p.add_argument("--clients", type=int, default=64, help="wrk connections (default 64)")
    p.add_argument("--rate", type=float, default=20.0, help="scrapes per second (default 20)")
    p.add_argument(
        "--paths", default=DEFAULT_PATHS, help=f"read at each scrape (default {DEFAULT_PATHS})"
    )
    p.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds")
    p.add_argument("--ref", default=None, help="run the runner from this commit (e.g. HEAD)")
    p.add_argument("--quiet-below", type=float, default=0.5, help="wait for others < cores")
    p.add_argument("--quiet-wait", type=float, default=30.0, help="wait at most (s)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    require_wrk()
    facts = {
        "command": ".venv/bin/python -m bench.scrape.run " + " ".join(sys.argv[1:]),
        "code": f"commit {resolve_ref(args.ref)}" if args.ref else "work tree",
        "machine": machine_facts(),
        "loadavg_before": loadavg(),
    }
    result = run(args)
    facts["loadavg_after"] = loadavg()
    print("BENCH_RESULT " + json.dumps({**facts, **result}))
    r = result
    print(
        f"\nthroughput with {args.rate:g} scrapes/s ÷ without, {args.clients} clients: "
        f"{r['ratio_median']:.4f} [{r['ratio_min']:.4f}, {r['ratio_max']:.4f}] "
        f"({r['rps_quiet_median']:.0f} vs {r['rps_scraped_median']:.0f} req/s); scrape p50 "
        f"{r['scrape_ms']['p50']:.2f} ms, p99 {r['scrape_ms']['p99']:.2f} ms, max "
        f"{r['scrape_ms']['max']:.2f} ms over {r['scrapes']} scrapes "
        f"({r['scrapes_per_s']:.1f}/s, {r['scrape_bytes']:.0f} bytes each); runner CPU per "
        f"request {r['runner_cpu_us_per_req']['quiet']:.0f} / "
        f"{r['runner_cpu_us_per_req']['scraped']:.0f} µs; errors {r['errors']}"
    )
    by_path = ", ".join(f"{p} {us:.0f} µs" for p, us in r["scrape_cpu_us_by_path"].items())
    print(
        f"runner CPU per scrape {r['scrape_cpu_us']:.0f} µs ({by_path}; GET /health: "
        f"{r['health_cpu_us']:.0f} µs): {args.rate:g}/s take {100 * r['scrape_cores']:.2f}% of "
        f"a core, the most throughput they can cost a runner whose event loop is saturated; "
        f"the runner used {r['runner_cores_under_load']:.2f} cores under this load, the "
        f"scraper itself {r['scraper_cores']:.3f} of the same cores; other "
        f"jobs used {r['other_cores_median']:.2f} cores (median)"
    )
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
