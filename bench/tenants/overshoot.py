"""(b) Token budgets never overshoot: one tenant with a 2,000-token-per-minute budget,
64 concurrent clients spread over 2 replicas on one Redis, the fake engine reporting
usage (as llama-server does).

    .venv/bin/python -m bench.tenants.overshoot [--windows 2] [--clients 64]
        [--budget 2000] [--backoff-s 0.2] [--ref HEAD] [--docs]

From the start of the next UTC minute, for `--windows` whole minutes, 64 clients (half
to each replica) send small chat requests (`max_tokens` 8) as tenant `metered`, each
waiting `--backoff-s` after a 429 (not the `Retry-After`: the point is to press on the
budget the whole window). Then, for every minute window:

- served: the budget's own counter in Redis once every request has ended (what the
  requests admitted in that window were charged: the engine's usage, since each
  reservation is settled to it), checked against the client's view: the sum of the
  usage of every 200 answer equals the sum of the counters, and the answers sent and
  finished inside a window (a lower bound of those admitted in it) never add up to more
  than the budget;
- overshoot: served - budget when positive (target 0);
- usable share: served ÷ budget (target >= 0.9: reconciliation gives back what a
  request reserved and did not use; what stays unusable is less than one reservation).

Writes `bench/results/tenants-overshoot-<time>.json`; `--docs` rewrites its block in the
"Tenant policy (issue 26)" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import redis

from bench.proxy.procs import loadavg, machine_facts, resolve_ref
from bench.tenants.common import log, replicas, save, write_block

TENANT = "metered"
BODY = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


async def client(
    i: int, urls: tuple[str, str], until: float, backoff_s: float, log_: list[dict[str, Any]]
) -> None:
    """One client: send, record, again until `until` (wall clock)."""
    url = urls[i % 2] + "/v1/chat/completions"
    headers = {"X-Tenant-ID": TENANT}
    async with httpx.AsyncClient(timeout=60) as http:
        while time.time() < until:
            sent = time.time()
            answer = await http.post(url, json=BODY, headers=headers)
            done = time.time()
            used = answer.json()["usage"]["total_tokens"] if answer.status_code == 200 else 0
            log_.append({"sent": sent, "done": done, "status": answer.status_code, "used": used})
            if answer.status_code != 200:
                await asyncio.sleep(backoff_s)


def counters(redis_url: str, tenant: str) -> dict[int, int]:
    """The per-minute total-token counters of `tenant`, by window start."""
    r = redis.Redis.from_url(redis_url)
    found = {}
    for key in r.scan_iter(match=f"quorum:budget:{{{tenant}}}|minute:total:*|*"):
        found[int(key.decode().rsplit("|", 1)[1])] = int(r.get(key) or 0)
    r.close()
    return dict(sorted(found.items()))


def analyse(
    log_: list[dict[str, Any]], served: dict[int, int], budget: int, windows: list[int]
) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    for x in log_:
        statuses[str(x["status"])] = statuses.get(str(x["status"]), 0) + 1
    rows = []
    for start in windows:
        inside = [x for x in log_ if start <= x["sent"] and x["done"] < start + 60]
        lower = sum(x["used"] for x in inside)
        rows.append(
            {
                "window": datetime.fromtimestamp(start, UTC).strftime("%H:%M"),
                "served": served.get(start, 0),
                "client_lower_bound": lower,
                "admitted": sum(1 for x in inside if x["status"] == 200),
                "refused": sum(1 for x in inside if x["status"] == 429),
                "overshoot": max(0, served.get(start, 0) - budget),
                "usable_share": round(served.get(start, 0) / budget, 4),
            }
        )
    return {
        "statuses": statuses,
        "windows": rows,
        "client_total": sum(x["used"] for x in log_),
        "counters_total": sum(served.values()),
        "max_overshoot": max(r["overshoot"] for r in rows),
        "min_usable_share": min(r["usable_share"] for r in rows),
        "client_lower_bound_over_budget": any(r["client_lower_bound"] > budget for r in rows),
    }


def markdown(result: dict[str, Any]) -> str:
    a = result["analysis"]
    lines = [
        f"Run {result['started']}, commit {result['ref']}: {result['clients']} clients over 2 "
        f"replicas on one Redis, one tenant with {result['budget']} tokens per minute, "
        f"{len(a['windows'])} whole minute windows; the fake engine reports usage. Command:",
        "",
        f"    {result['command']}",
        "",
        f"Load average before {result['loadavg_before']}, after {result['loadavg_after']}. "
        f"Answers: {', '.join(f'{k}: {v}' for k, v in sorted(a['statuses'].items()))}. "
        f"Usage in the answers {a['client_total']} tokens = the windows' counters "
        f"{a['counters_total']} tokens.",
        "",
        "| window (UTC) | served (counter) | sent and answered inside (client) | admitted | "
        "refused | overshoot | usable share |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for w in a["windows"]:
        lines.append(
            f"| {w['window']} | {w['served']} | {w['client_lower_bound']} | {w['admitted']} | "
            f"{w['refused']} | {w['overshoot']} | {w['usable_share']:.3f} |"
        )
    lines += [
        "",
        f"Overshoot: {a['max_overshoot']} (target 0); usable share at least "
        f"{a['min_usable_share']:.3f} (target >= 0.9).",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="token budgets: overshoot and usable share")
    p.add_argument("--windows", type=int, default=2, help="whole minute windows measured")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--budget", type=int, default=2000)
    p.add_argument("--backoff-s", type=float, default=0.2)
    p.add_argument("--ref", default="HEAD")
    p.add_argument("--docs", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = datetime.now(UTC)
    tenants = (
        f"tenants:\n  {TENANT}:\n    token_budgets: [{{tokens: {args.budget}, per: minute}}]\n"
    )
    result: dict[str, Any] = {
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "command": ".venv/bin/python -m bench.tenants.overshoot " + " ".join(sys.argv[1:]),
        "ref": resolve_ref(args.ref),
        "clients": args.clients,
        "budget": args.budget,
        "machine": machine_facts(),
        "loadavg_before": loadavg(),
    }
    with replicas(tenants, ("--latency-ms", "20"), result["ref"]) as pair:
        first = (int(time.time()) // 60 + 1) * 60
        log(f"runners {[r.proc.pid for r in pair.runners]}; clients start at {first}")
        time.sleep(max(0.0, first - time.time()))
        until = first + 60 * args.windows
        records: list[dict[str, Any]] = []

        async def run_all() -> None:
            await asyncio.gather(
                *(client(i, pair.urls, until, args.backoff_s, records) for i in range(args.clients))
            )

        asyncio.run(run_all())  # every request has ended: its reservation is settled
        time.sleep(1.0)  # settlements run in the background, right after each answer
        served = counters(pair.redis_url, TENANT)
    windows = [first + 60 * k for k in range(args.windows)]
    result["analysis"] = analyse(records, served, args.budget, windows)
    result["loadavg_after"] = loadavg()
    result["records"] = records
    save("overshoot", started, result)
    generated = markdown(result)
    print("\n" + generated + "\n")
    if args.docs:
        write_block("overshoot", generated)
    a = result["analysis"]
    ok = a["max_overshoot"] == 0 and a["min_usable_share"] >= 0.9
    return 0 if ok and a["client_total"] == a["counters_total"] else 1


if __name__ == "__main__":
    sys.exit(main())
