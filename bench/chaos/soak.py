"""The soak's schedule (a kill every `period_s`, in turn: the Redis primary, a runner, an
engine; the next one only once service is back) and its invariants, checked at the end."""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from bench.chaos.fleet import MAX_TOKENS, ChaosFleet, RealLlama
from bench.chaos.load import Answer, Job, Load, first_ok

KINDS = ("redis-primary", "runner", "engine")
CONTRACT = {200, 202, 409, 429, 502, 503, 504}  # docs/reliability.md, runner/errors.py
NEEDS_RETRY_AFTER = {429, 503}
RECOVERY_LIMIT_S = 90.0  # the stated time: service back through every runner within it


@dataclass
class Kill:
    kind: str
    slot: int | None  # the runner (or the runner whose engine) killed; None: Redis
    at: float
    recovered_s: dict[int, float | None] = field(default_factory=dict)  # per runner


@dataclass
class Soak:
    minutes: float
    period_s: float = 30.0
    warmup_s: float = 10.0
    workers: int = 6
    pace_s: float = 0.25
    real_share: float = 0.05
    budgets: dict[str, int] = field(
        default_factory=lambda: {"small": 600, "medium": 6000, "large": 10_000_000}
    )
    in_flight: int = 4
    redis: str = "sentinel"  # or "cluster": three primaries, a node killed in turn


@dataclass
class Result:
    answers: list[Answer]
    kills: list[Kill]
    tokens: int
    budgets: dict[str, int]
    workers_per_tenant: int
    seconds: float
    jobs: list[Job] = field(default_factory=list)
    runs: Counter[int] = field(default_factory=Counter)  # seed -> prompts run with it


def read_runs(ledgers: list[Path]) -> Counter[int]:
    """How often each job's seed ran in the fake ComfyUIs (their warm-ups left out)."""
    runs: Counter[int] = Counter()
    for ledger in ledgers:
        if not ledger.exists():
            continue
        for line in ledger.read_text().splitlines():
            graph = json.loads(line)["prompt"]
            if "/warmup" in str(graph["3"]["inputs"]["filename_prefix"]):
                continue
            runs[int(graph["1"]["inputs"]["color"])] += 1
    return runs


def run(soak: Soak, real: RealLlama | None) -> Result:
    """Start the fleet, load it, kill on the schedule (at least one of each kind), stop."""
    tenants = list(soak.budgets)
    with ChaosFleet(soak.budgets, soak.in_flight, real, soak.redis) as fleet:
        load = Load(fleet, tenants, soak.workers, soak.pace_s, soak.real_share)
        start = time.monotonic()
        load.start()
        kills: list[Kill] = []
        next_at, end = start + soak.warmup_s, start + soak.minutes * 60
        try:
            while len(kills) < len(KINDS) or time.monotonic() < end:
                load.stop.wait(max(0.0, next_at - time.monotonic()))  # the schedule's clock
                kill = _kill(fleet, load, KINDS[len(kills) % len(KINDS)], len(kills))
                kills.append(kill)
                _await_recovery(fleet, load, kill)
                next_at = max(time.monotonic(), kill.at + soak.period_s)
        finally:
            load.join()
        seconds = time.monotonic() - start
        load.settle_jobs()
        runs = read_runs(fleet.ledgers())
    per_tenant = max(1, soak.workers // len(tenants))
    return Result(
        load.answers, kills, len(load.tokens), soak.budgets, per_tenant, seconds, load.jobs, runs
    )


def _kill(fleet: ChaosFleet, load: Load, kind: str, n: int) -> Kill:
    if kind == "redis-primary":
        return Kill(kind, None, fleet.kill_redis_primary())
    slot = fleet.slots[(n // len(KINDS)) % len(fleet.slots)]
    if kind == "engine":
        return Kill(kind, slot.index, fleet.kill_engine(slot))
    load.restarting(slot.index, True)  # a load balancer stops sending to it
    try:
        return Kill(kind, slot.index, fleet.kill_runner(slot))
    finally:
        load.restarting(slot.index, False)


def _await_recovery(fleet: ChaosFleet, load: Load, kill: Kill) -> None:
    """Wait (on the answers recorded) for a 200 through each runner concerned, started after
    the kill; a runner not back within RECOVERY_LIMIT_S is recorded None."""
    slots = [kill.slot] if kill.slot is not None else [s.index for s in fleet.slots]
    deadline = kill.at + RECOVERY_LIMIT_S
    while True:
        answers = list(load.answers)
        for index in slots:
            ok = first_ok(answers, kill.at, partial(_chat_through, index))
            kill.recovered_s[index] = None if ok is None else ok - kill.at
        if all(v is not None for v in kill.recovered_s.values()) or time.monotonic() > deadline:
            return
        load.stop.wait(0.2)  # polling the recorded answers


def _chat_through(index: int, a: Answer) -> bool:
    return a.kind == "chat" and a.slot == index


def _cut_by_a_kill(a: Answer, kills: list[Kill]) -> bool:
    """No HTTP answer from a runner that was SIGKILLed while the request was out."""
    for kill in kills:
        mine = kill.kind == "runner" and kill.slot == a.slot
        if mine and a.started <= kill.at + 1.0 and a.ended >= kill.at - 1.0:
            return True
    return False


def check(result: Result) -> dict[str, object]:
    """The invariants and the figures (docs/reliability.md, "The chaos soak")."""
    answers, kills = result.answers, result.kills
    flush = [a for a in answers if a.kind == "flush"]
    performed = Counter(a.token for a in flush if a.status == 200)
    twice = sorted(t for t, n in performed.items() if n > 1)
    off_contract = [
        a
        for a in answers
        if (a.status == 0 and not _cut_by_a_kill(a, kills))
        or (a.status and a.status not in CONTRACT)
        or (a.status in NEEDS_RETRY_AFTER and not a.retry_after)
    ]
    cut = [a for a in answers if a.status == 0 and _cut_by_a_kill(a, kills)]
    redis_kills = sum(k.kind == "redis-primary" for k in kills)
    bound = redis_kills * result.workers_per_tenant * MAX_TOKENS
    spent: Counter[str] = Counter()
    for a in answers:
        if a.status == 200 and a.kind in ("chat", "real"):
            spent[a.tenant] += a.output_tokens
    over = {t: spent[t] - b for t, b in result.budgets.items() if spent[t] > b + bound}
    recovery: dict[str, list[float]] = {k: [] for k in KINDS}
    never = []
    for kill in kills:
        for index, seconds in kill.recovered_s.items():
            if seconds is None:
                never.append(f"{kill.kind}@{index}")
            else:
                recovery[kill.kind].append(seconds)
    jobs = result.jobs
    lost = [j.id for j in jobs if j.status in ("lost", "unfinished")]
    ran_twice = sorted(j.id for j in jobs if result.runs[j.seed] > 1)
    never_ran = sorted(j.id for j in jobs if j.status == "succeeded" and not result.runs[j.seed])
    return {
        "seconds": round(result.seconds),
        "requests": len(answers),
        "by_kind": dict(Counter(a.kind for a in answers)),
        "statuses": dict(sorted(Counter(a.status for a in answers).items())),
        "refusals": dict(
            Counter(f"{a.status} {a.code or a.error}" for a in answers if a.status != 200)
        ),
        "kills": dict(Counter(k.kind for k in kills)),
        "tokens_sent": result.tokens,
        "flush_sends": len(flush),
        "tokens_performed_once": sum(1 for n in performed.values() if n == 1),
        "tokens_performed_twice": twice,
        "off_contract": [(a.kind, a.slot, a.status, a.code, a.error) for a in off_contract],
        "cut_by_runner_kill": len(cut),
        "budget_bound": bound,
        "budget_spent": {t: (spent[t], b) for t, b in result.budgets.items()},
        "budget_over_bound": over,
        "recovery_s": {
            k: (round(statistics.median(v), 1), round(max(v), 1)) if v else None
            for k, v in recovery.items()
        },
        "not_recovered": never,
        "jobs_accepted": len(jobs),
        "jobs_ended": dict(Counter(f"{j.status} {j.code}".strip() for j in jobs)),
        "jobs_lost": lost,
        "jobs_run_twice": ran_twice,
        "jobs_succeeded_without_a_run": never_ran,
        "held": not (twice or off_contract or over or never or lost or ran_twice or never_ran),
    }


def table(figures: dict[str, object]) -> str:
    return "\n".join(f"| {name} | {value} |" for name, value in figures.items())
