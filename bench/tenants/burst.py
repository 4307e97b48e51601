"""(d) P17's one-shot burst (issue 36): how much of a token budget a burst can use when
each request reserves far more than it uses, and that it is never overspent.

    .venv/bin/python -m bench.tenants.burst [--refs f34d4e0,HEAD] [--clients 64]
        [--requests 256] [--latency-ms 200] [--budgets 1500:total,1500:output,4000:total]
        [--backend llama-server] [--docs]

One tenant per measurement, `tokens` per minute counting `count` tokens; 64 clients send
256 chat requests in all (each client its share one after the other, no retries) with
`max_tokens: 100`, each answered by the fake engine (usage as llama-server reports it,
`--latency-ms` an answer) with 8 prompt and 9 completion tokens, attached as `--backend`
(`llama-server`, the default: the runner may ask it to count a prompt, as it asks a real
llama-server, adapters/prompt_tokens.py; `openai`: a kind that cannot count). The burst
starts with at least 35 s left in its minute (else at the next minute), so one window
holds it. Setups: one runner (the counters in its memory) and two replicas on one Redis
(clients alternating), each from each ref's packages (`git archive`), the refs
interleaved.

Per burst: tokens served (what the budget counts of the usage of every 200 answer; with
Redis, the window's counter beside it), the usable share (served ÷ budget, target >= 0.9),
the overshoot (served - budget when positive, target 0), answers, the reservation of one
request (the `requested` of a refusal: for `total`, the prompt's bound + max_tokens, the
bound being the body's bytes + the template's allowance, or the engine's count where the
kind counts and the byte bound did not fit), the wait in line (`x-budget-wait-ms`) and
the refusals' `Retry-After`. What stays unusable is at most one reservation: a request
is refused once spent + its reservation exceeds the budget, so the share is at least
1 - reservation ÷ budget.

Writes `bench/results/tenants-burst-<time>.json`; `--docs` rewrites its block in the
"Tenant policy (issue 26)" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import redis

from bench.proxy.procs import (
    FEATURES_ON,
    code_snapshot,
    loadavg,
    machine_facts,
    resolve_ref,
    start_runner,
)
from bench.tenants.common import log, save, write_block
from tests.fixtures.launch import start_fake
from tests.support.redis_server import RedisServer

BODY = {
    "model": "echo",
    "messages": [{"role": "user", "content": "tell me one short thing about the sea"}],
    "max_tokens": 100,
}
SETUPS = ("one runner", "two replicas")


async def burst(urls: list[str], tenant: str, clients: int, requests: int) -> list[dict[str, Any]]:
    """Every request's outcome: sent, done (wall clock), status, usage, headers read."""
    records: list[dict[str, Any]] = []

    async def client(i: int, http: httpx.AsyncClient) -> None:
        url = urls[i % len(urls)] + "/v1/chat/completions"
        for _ in range(requests // clients):
            sent = time.time()
            answer = await http.post(url, json=BODY, headers={"X-Tenant-ID": tenant})
            body = answer.json()
            records.append(
                {
                    "sent": sent,
                    "done": time.time(),
                    "status": answer.status_code,
                    "usage": body["usage"] if answer.status_code == 200 else None,
                    "waited_ms": int(answer.headers.get("x-budget-wait-ms", 0)),
                    "retry_after": answer.headers.get("retry-after"),
                    "requested": body.get("error", {}).get("requested"),
                    "code": body.get("error", {}).get("code"),
                }
            )

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        await asyncio.gather(*(client(i, http) for i in range(clients)))
    return records


def counter(redis_url: str, tenant: str) -> int:
    """The tenant's minute counter(s) in Redis, summed (one window holds the burst)."""
    r = redis.Redis.from_url(redis_url)
    total = sum(
        int(r.get(key) or 0) for key in r.scan_iter(match=f"quorum:budget:{{{tenant}}}|minute:*|*")
    )
    r.close()
    return total


COUNTED = {"total": "total_tokens", "input": "prompt_tokens", "output": "completion_tokens"}


def analyse(records: list[dict[str, Any]], budget: int, count: str) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    for x in records:
        statuses[str(x["status"])] = statuses.get(str(x["status"]), 0) + 1
    served = sum(x["usage"][COUNTED[count]] for x in records if x["usage"] is not None)
    waits = sorted(x["waited_ms"] for x in records if x["status"] == 200)
    retry = sorted(int(x["retry_after"]) for x in records if x["status"] == 429)
    requested = [x["requested"] for x in records if x["requested"] is not None]
    start = min(x["sent"] for x in records)
    window = int(start // 60) * 60
    return {
        "statuses": statuses,
        "served": served,
        "usable_share": round(served / budget, 4),
        "overshoot": max(0, served - budget),
        "reservation": requested[0] if requested else None,
        "wait_ms_p50": statistics.median(waits) if waits else 0,
        "wait_ms_max": waits[-1] if waits else 0,
        "retry_after": [retry[0], retry[-1]] if retry else None,
        "seconds": round(max(x["done"] for x in records) - start, 2),
        "in_one_window": max(x["done"] for x in records) < window + 60,
    }


def align() -> None:
    """Start with at least 35 s left in the current minute, else at the next one."""
    left = 60 - time.time() % 60
    if left < 35:
        time.sleep(left + 0.5)


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Run {result['started']}: {result['clients']} clients, {result['requests']} requests "
        f"with `max_tokens: 100` each using 17 tokens (8 prompt, 9 completion), the fake "
        f"engine {result['latency_ms']} ms an answer, attached as "
        f"`{result.get('backend', 'openai')}`; one tenant per line, per minute "
        f"budgets; the refs interleaved. Load average before {result['loadavg_before']}, "
        f"after {result['loadavg_after']} (a busy shared 2-core machine: the times are "
        "loose, the shares and overshoot are what count). Command:",
        "",
        f"    {result['command']}",
        "",
        "| budget (per minute) | setup | ref | 200 / 429 / other | served (Redis counter) | usable "
        "share | overshoot | one reservation | wait in line p50 / max (ms) | Retry-After of "
        "429s | burst (s) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        a = row["analysis"]
        retry = "-" if a["retry_after"] is None else "{}-{}".format(*a["retry_after"])
        served = f"{a['served']} ({a['counter']})" if "counter" in a else str(a["served"])
        ok = a["statuses"].get("200", 0)
        other = ", ".join(f"{n} x {k}" for k, n in a["statuses"].items() if k not in ("200", "429"))
        other = other or "0"
        lines.append(
            f"| {row['budget']} {row['count']} | {row['setup']} | {row['ref']} | "
            f"{ok} / {a['statuses'].get('429', 0)} / {other} | {served} | "
            f"{a['usable_share']:.3f} | {a['overshoot']} | {a['reservation'] or '-'} | "
            f"{a['wait_ms_p50']:.0f} / {a['wait_ms_max']} | {retry} | {a['seconds']} |"
        )
    lines += [
        "",
        "A request is refused once the spent tokens plus its reservation exceed the budget, "
        "so what stays unusable is less than one reservation: the usable share is at least "
        "1 - reservation ÷ budget (for 1500 total tokens: 0.81 with the byte bound's "
        "292-token reservation, 0.93 with the counted prompt's 108; 0.93 for 1500 output "
        "tokens and 100, 0.93 for 4000 total with the byte bound). A ref before the count "
        "(eb3eddb and older) reserves the byte bound whatever the kind.",
    ]
    codes = sorted(
        {
            x["code"]
            for row in result["rows"]
            for x in row["records"]
            if x["status"] not in (200, 429) and x.get("code")
        }
    )
    if codes:
        lines[-1] += f" Other answers: {', '.join(codes)}."
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="token budgets: a one-shot burst (P17)")
    p.add_argument("--refs", default="f34d4e0,HEAD", help="comma-separated, interleaved")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--latency-ms", type=int, default=200)
    p.add_argument("--budgets", default="1500:total,1500:output,4000:total")
    p.add_argument("--backend", default="llama-server", choices=("llama-server", "openai"))
    p.add_argument("--docs", action="store_true")
    p.add_argument("--from-json", help="render (and with --docs write) a saved result")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:  # analysed again from its records (the counters as measured)
        saved = json.loads(Path(args.from_json).read_text())
        for row in saved["rows"]:
            counted = row["analysis"].get("counter")
            row["analysis"] = analyse(row["records"], row["budget"], row["count"])
            if counted is not None:
                row["analysis"]["counter"] = counted
        generated = markdown(saved)
        print(generated)
        if args.docs:
            write_block("burst", generated)
        return 0
    started = datetime.now(UTC)
    refs = [resolve_ref(r) for r in args.refs.split(",")]
    budgets = [(int(b), c) for b, c in (spec.split(":") for spec in args.budgets.split(","))]
    tenants = {
        (i, s, r): f"burst-{i}-{s}-{k}"
        for i in range(len(budgets))
        for s in range(len(SETUPS))
        for k, r in enumerate(refs)
    }
    yaml = "tenants:\n" + "".join(
        f"  {name}:\n    token_budgets: [{{tokens: {budgets[i][0]}, per: minute, "
        f"count: {budgets[i][1]}}}]\n"
        for (i, _, _), name in tenants.items()
    )
    result: dict[str, Any] = {
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "command": ".venv/bin/python -m bench.tenants.burst " + " ".join(sys.argv[1:]),
        "refs": refs,
        "clients": args.clients,
        "requests": args.requests,
        "latency_ms": args.latency_ms,
        "backend": args.backend,
        "machine": machine_facts(),
        "loadavg_before": loadavg(),
        "rows": [],
    }
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-burst-")))
        (tmp / "tenants.yaml").write_text(yaml)
        server = RedisServer().start()
        stack.callback(server.stop)
        engine = stack.enter_context(
            start_fake("fake_openai", "--latency-ms", str(args.latency_ms))
        )
        env = {
            **FEATURES_ON,
            "TENANTS_FILE": str(tmp / "tenants.yaml"),
            "QUEUE_TIMEOUT_MS": "120000",
        }
        urls: dict[str, tuple[list[str], list[str]]] = {}
        for ref in refs:
            code = stack.enter_context(code_snapshot(ref, ("faults",)))
            run = functools.partial(start_runner, engine.url, 64, code, backend=args.backend)
            one = stack.enter_context(run(env=env))
            shared = {**env, "REDIS_URL": server.url}
            two = [
                stack.enter_context(run(env={**shared, "RUNNER_ID": f"{ref}-{x}"})) for x in "ab"
            ]
            urls[ref] = ([one.url], [r.url for r in two])
        for i, (budget, count) in enumerate(budgets):
            for s, setup in enumerate(SETUPS):
                for ref in refs:
                    tenant = tenants[(i, s, ref)]
                    align()
                    log(f"{budget} {count} per minute, {setup}, {ref}: {tenant}")
                    records = asyncio.run(burst(urls[ref][s], tenant, args.clients, args.requests))
                    a = analyse(records, budget, count)
                    if s == 1:
                        time.sleep(1.0)  # settlements go out in the background
                        a["counter"] = counter(server.url, tenant)
                    log(f"  served {a['served']} ({a['usable_share']:.3f}), {a['statuses']}")
                    row = {"budget": budget, "count": count, "setup": setup, "ref": ref}
                    result["rows"].append({**row, "analysis": a, "records": records})
    result["loadavg_after"] = loadavg()
    save("burst", started, result)
    generated = markdown(result)
    print("\n" + generated + "\n")
    if args.docs:
        write_block("burst", generated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
