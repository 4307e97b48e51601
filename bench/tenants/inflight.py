"""(c) An in-flight cap holds across replicas: a tenant with `max_in_flight: 2`, clients
spread over 2 replicas on one Redis, one engine that counts the requests it is answering
at once.

    .venv/bin/python -m bench.tenants.inflight [--duration 20] [--clients 32]
        [--latency-ms 200] [--ref HEAD] [--docs]

`--clients` clients (half to each replica) send chat requests as tenant `capped` for
`--duration` s; the fake engine answers each after `--latency-ms` and records the most
requests it had at once (`/_fake/stats` `max_in_flight`). Targets: that maximum is the cap
(2: never a third), every request is answered 200 (a capped request waits its turn, it is
not refused), and throughput is near the cap's (cap ÷ latency).

Writes `bench/results/tenants-inflight-<time>.json`; `--docs` rewrites its block in the
"Tenant policy (issue 26)" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from datetime import UTC, datetime
from typing import Any

import httpx

from bench.proxy.procs import loadavg, machine_facts, resolve_ref
from bench.tenants.common import log, replicas, save, write_block

TENANT, CAP = "capped", 2
BODY = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


async def client(i: int, urls: tuple[str, str], until: float, out: list[tuple[int, float]]) -> None:
    url = urls[i % 2] + "/v1/chat/completions"
    async with httpx.AsyncClient(timeout=120) as http:
        while time.monotonic() < until:
            sent = time.monotonic()
            answer = await http.post(url, json=BODY, headers={"X-Tenant-ID": TENANT})
            out.append((answer.status_code, time.monotonic() - sent))


def markdown(result: dict[str, Any]) -> str:
    r = result
    statuses = ", ".join(f"{k}: {v}" for k, v in sorted(r["statuses"].items()))
    lines = [
        f"Run {r['started']}, commit {r['ref']}: tenant `{TENANT}` with `max_in_flight: {CAP}`, "
        f"{r['clients']} clients over 2 replicas on one Redis for {r['duration_s']:g} s, the "
        f"engine answering each request after {r['latency_ms']} ms. Command:",
        "",
        f"    {r['command']}",
        "",
        f"Load average before {r['loadavg_before']}, after {r['loadavg_after']}.",
        "",
        "| requests | answers | most at the engine at once | throughput (req/s) | "
        "cap ÷ latency (req/s) | client wait p50 / max (s) |",
        "|---:|---|---:|---:|---:|---:|",
        f"| {r['requests']} | {statuses} | {r['engine_max_in_flight']} | {r['rps']:.2f} | "
        f"{r['ideal_rps']:.2f} | {r['wait_p50_s']:.2f} / {r['wait_max_s']:.2f} |",
        "",
        f"Target: at most {CAP} at once (never a third) and every answer 200: "
        f"{'met' if r['met'] else 'missed'}.",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="in-flight cap across 2 replicas")
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--latency-ms", type=int, default=200)
    p.add_argument("--ref", default="HEAD")
    p.add_argument("--docs", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = datetime.now(UTC)
    result: dict[str, Any] = {
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "command": ".venv/bin/python -m bench.tenants.inflight " + " ".join(sys.argv[1:]),
        "ref": resolve_ref(args.ref),
        "clients": args.clients,
        "duration_s": args.duration,
        "latency_ms": args.latency_ms,
        "machine": machine_facts(),
        "loadavg_before": loadavg(),
    }
    tenants = f"tenants:\n  {TENANT}:\n    max_in_flight: {CAP}\n"
    engine_args = ("--latency-ms", str(args.latency_ms))
    with replicas(tenants, engine_args, result["ref"]) as pair:
        log(f"runners {[r.proc.pid for r in pair.runners]}; {args.clients} clients")
        httpx.post(pair.engine.url + "/_fake/reset")
        answers: list[tuple[int, float]] = []
        began = time.monotonic()
        until = began + args.duration

        async def run_all() -> None:
            await asyncio.gather(
                *(client(i, pair.urls, until, answers) for i in range(args.clients))
            )

        asyncio.run(run_all())
        elapsed = time.monotonic() - began
        stats = httpx.get(pair.engine.url + "/_fake/stats").json()
    statuses: dict[str, int] = {}
    for status, _ in answers:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    waits = [w for _, w in answers]
    result.update(
        requests=len(answers),
        statuses=statuses,
        engine_max_in_flight=stats["max_in_flight"],
        engine_requests=stats["by_path"].get("/v1/chat/completions", 0),
        rps=len(answers) / elapsed,
        ideal_rps=CAP / (args.latency_ms / 1000),
        wait_p50_s=statistics.median(waits),
        wait_max_s=max(waits),
        loadavg_after=loadavg(),
    )
    result["met"] = result["engine_max_in_flight"] <= CAP and set(statuses) == {"200"}
    save("inflight", started, result)
    generated = markdown(result)
    print("\n" + generated + "\n")
    if args.docs:
        write_block("inflight", generated)
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
