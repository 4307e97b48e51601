"""The tenant policy's own work per request, in process: what bench/tenants/datapath.py's
`on` side adds to each JSON request, without the HTTP, scheduler and engine around it
(whose cost, the same on both sides, buries a few microseconds in the end-to-end bench on a
shared machine).

    .venv/bin/python -m bench.tenants.guard [--refs integ,HEAD] [--requests 20000] [--reps 9]

Per request, as the front-end and the chat path do it, `off` without a tenants file and
`on` with datapath.py's (8 tenants in turn, each with an entitlement list, a priority
default and ceiling and two token budgets; embedded stores): the tenant's policy, the
effective priority, the entitlement check, the request's bounds, the budgets reserved
(and their headers), the reservation settled to a smaller usage, the usage recorded;
then one pass of the event loop (`asyncio.sleep(0)`, the runner's uvloop), where a
settlement left in the background runs. Each ref's packages (`git archive`) run in a
subprocess of their own, off and on alternating in it; the refs alternate, `--reps`
times; per ref and side the median and [min, max] of µs per request, and of `on - off`
per round.

Writes `bench/results/tenants-guard-<time>.json`; `--docs` writes the generated block of
the "Tenant policy (issue 26)" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

from bench.proxy.procs import REPO_ROOT, code_snapshot, loadavg, machine_facts, resolve_ref
from bench.proxy.report import spread
from bench.tenants.common import log, save, write_block


async def _requests(n: int) -> dict[str, float]:
    """µs per request of the work, `off` (no tenants file: the default policy) and `on`
    (datapath.py's tenants), alternating in blocks of a tenth (the packages found first on
    sys.path)."""
    import tempfile

    from bench.proxy.run import BODIES
    from bench.tenants.datapath import TENANTS, tenants_file
    from runner.tenancy.guard import Spent, output_bound, prompt_bound
    from runner.tenancy.usage import UsageRecorder
    from tenants.budget_store import MemoryBudgetStore
    from tenants.config import TenantsConfig, parse_tenants_file
    from tenants.policy import effective_priority
    from tenants.usage_store import SqliteUsageStore

    try:  # a ref before issue 36 keeps `Budgets` in guard.py
        from runner.tenancy.token_budgets import Budgets
    except ImportError:
        from runner.tenancy.guard import Budgets  # type: ignore[attr-defined,no-redef]

    configs = {"off": TenantsConfig(), "on": parse_tenants_file(tenants_file(), "bench")}
    body = json.dumps(BODIES["json"]).encode()
    obj = json.loads(body)
    budgets = Budgets(MemoryBudgetStore())
    with tempfile.TemporaryDirectory(prefix="bench-guard-") as tmp:
        usage = UsageRecorder(SqliteUsageStore(f"{tmp}/usage.sqlite3"), retention_s=86_400)

        async def one(config: TenantsConfig, i: int) -> None:
            tenant = TENANTS[i % len(TENANTS)]
            policy = config.policy(tenant)
            effective_priority(None, policy.priority_default, policy.priority_max)
            if not policy.models.allows("echo"):
                raise SystemExit("the bench's tenants must be entitled to echo")
            spent = Spent(prompt_bound(body, obj), output_bound(obj, None, False)[0])
            held, _headers = await budgets.reserve(
                tenant, policy, "echo", spent.input_bound, spent.output_bound
            )
            spent.reached_engine = spent.reported = True
            spent.prompt, spent.completion = 20, 10  # the engine's usage: below the bounds
            used_in, used_out = spent.used()
            budgets.settle(held, used_in, used_out)
            usage.request(tenant, "echo", 200, prompt=used_in, completion=used_out)
            await asyncio.sleep(0)

        spent_s = dict.fromkeys(configs, 0.0)
        block = max(1, n // 10)
        for config in configs.values():  # warm-up
            for i in range(min(n, 2000)):
                await one(config, i)
        for _ in range(10):
            for side, config in configs.items():
                started = time.perf_counter()
                for i in range(block):
                    await one(config, i)
                spent_s[side] += time.perf_counter() - started
        await budgets.idle()
        await usage.aclose()
    return {side: s / (10 * block) * 1e6 for side, s in spent_s.items()}


def _child(n: int) -> None:
    import uvloop

    print(json.dumps(uvloop.run(_requests(n))))


def _measure(code: str, n: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{code}{os.pathsep}{REPO_ROOT}"}
    out = subprocess.run(
        [sys.executable, "-m", "bench.tenants.guard", "--child", str(n)],
        cwd=code,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    value: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return value


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Run {result['started']}. Command:",
        "",
        f"    {result['command']}",
        "",
        f"Machine: {result['machine']['nproc']} cores ({result['machine']['cpu']}), load "
        f"average before {result['loadavg_before']}, after {result['loadavg_after']}. "
        f"{result['reps']} rounds of {result['requests']} requests per side and ref (the "
        "refs alternating, off and on alternating in each), median [min, max] µs per request "
        "of the work tenant policy touches (policy, priority, entitlement, bounds, budgets "
        "reserved and settled, usage, one pass of the event loop); `on - off` per round.",
        "",
        "| ref | commit | off (µs) | on (µs) | on - off (µs) |",
        "|---|---|---:|---:|---:|",
    ]
    for ref, row in result["refs"].items():
        cells = [_f(row["summary"][k]) for k in ("off", "on", "on_minus_off")]
        lines.append(f"| {ref} | {row['commit']} | {' | '.join(cells)} |")
    return "\n".join(lines)


def _f(s: dict[str, float]) -> str:
    return f"{s['median']:.1f} [{s['min']:.1f}, {s['max']:.1f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="tenant policy's own per-request work, per ref")
    p.add_argument("--refs", default="HEAD", help="commits to compare, comma-separated")
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--docs", action="store_true", help="rewrite the docs/benchmarks.md block")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        _child(args.child)
        return 0
    started = datetime.now(UTC)
    refs = args.refs.split(",")
    result: dict[str, Any] = {
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "command": ".venv/bin/python -m bench.tenants.guard " + " ".join(sys.argv[1:]),
        "requests": args.requests,
        "reps": args.reps,
        "machine": machine_facts(),
        "loadavg_before": loadavg(),
        "refs": {ref: {"commit": resolve_ref(ref), "rounds": []} for ref in refs},
    }
    with contextlib.ExitStack() as stack:
        codes = {ref: str(stack.enter_context(code_snapshot(ref, ("faults",)))) for ref in refs}
        for i in range(args.reps):
            for ref in refs[i % len(refs) :] + refs[: i % len(refs)]:
                us = _measure(codes[ref], args.requests)
                result["refs"][ref]["rounds"].append(us)
                log(f"round {i + 1}/{args.reps} {ref}: off {us['off']:.1f}, on {us['on']:.1f} µs")
    for row in result["refs"].values():
        rounds = row["rounds"]
        row["summary"] = {side: spread([r[side] for r in rounds]) for side in ("off", "on")}
        row["summary"]["on_minus_off"] = spread([r["on"] - r["off"] for r in rounds])
    result["loadavg_after"] = loadavg()
    save("guard", started, result)
    generated = markdown(result)
    print("\n" + generated + "\n")
    if args.docs:
        write_block("guard", generated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
