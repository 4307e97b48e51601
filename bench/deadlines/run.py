"""Deadline-aware admission, replayed on the real scheduler core (simulated clock).

    .venv/bin/python -m bench.deadlines.run [--seeds 3] [--duration 600]

Replays the overload trace of `trace.py` (2x the engine's capacity: interactive requests
with a 2 s deadline, batch ones with 60 s) through `runner.scheduler.core.Scheduler`
(`sim.py`), with the runner's limits `MAX_QUEUE_DEPTH` 256 and `QUEUE_TIMEOUT_MS` 30000,
in three set-ups:

- (a) `fifo`: FIFO with the queue timeout: one band, no fair share, no deadlines;
- (b) `priorities`: interactive `high`, batch `low`, fair share; no deadlines;
- (c) `deadlines`: (b), and each request carries its deadline (`X-Request-Deadline-Ms`).

and, to show what knowing the deadline adds over clients that simply hang up, (a) and
(b) again with clients that go away when their deadline passes (`+ give-up`).

Reported per set-up: deadline-met goodput (requests served whose first byte, the grant,
came within their deadline, per second; also in weighted tokens per second), what was
served too late (engine time spent for clients already gone), refusals by code; for (c)
the wall time of each `deadline_unreachable` decision (the whole `handle` call) and the
forecast's accuracy (forecast at arrival ÷ the wait it got, for requests that waited).
Targets (issue 19): goodput >= 1.3x (a)'s, refusals decided in <= 1 ms, forecast within
+-25% at p50. Prints Markdown; raw results go to `bench/results/deadlines-<time>.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from bench.deadlines.sim import Outcome, Replay, Variant
from bench.deadlines.trace import KINDS, SLOT_RATE, SLOTS, generate
from runner.scheduler.config import SchedulerConfig
from tenants.fairness import service_cost

ROOT = Path(__file__).resolve().parents[2]
CONFIG = SchedulerConfig(max_queue_depth=256, queue_timeout_s=30.0, low_aging_s=10.0)
VARIANTS = (
    Variant("(a) fifo", priorities=False, fair=False, deadlines=False),
    Variant("(b) priorities", priorities=True, fair=True, deadlines=False),
    Variant("(c) deadlines", priorities=True, fair=True, deadlines=True),
    Variant("(a) fifo + give-up", priorities=False, fair=False, deadlines=False, give_up=True),
    Variant("(b) priorities + give-up", priorities=True, fair=True, deadlines=False, give_up=True),
)
TARGET_GOODPUT = 1.3
TARGET_REFUSAL_MS = 1.0
TARGET_FORECAST = 0.25


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (0 with no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
    """One set-up's figures, pooled over the seeds."""
    fates = [f for o in outcomes for f in o.fates]
    seconds = sum(o.duration_s for o in outcomes)
    met = [f for f in fates if f.met]
    late = [f for f in fates if f.done_at is not None and not f.met]
    refusals: dict[str, int] = {}
    for f in fates:
        if f.refused is not None:
            refusals[f.refused] = refusals.get(f.refused, 0) + 1
    refused = [f for f in fates if f.refused == "deadline_unreachable"]
    decide_ms = [f.decide_ns / 1e6 for f in refused]
    decide_cpu_ms = [f.decide_cpu_ns / 1e6 for f in refused]
    ratios = [
        f.forecast_s / f.wait_s
        for f in fates
        if f.forecast_s is not None and f.wait_s is not None and f.wait_s > 0
    ]
    by_kind = {}
    for kind in KINDS:
        mine = [f for f in fates if f.arrival.kind is kind]
        kind_ratios = [
            f.forecast_s / f.wait_s
            for f in mine
            if f.forecast_s is not None and f.wait_s is not None and f.wait_s > 0
        ]
        by_kind[kind.name] = {
            "arrived": len(mine),
            "met": sum(f.met for f in mine),
            "forecast_ratio_p50": percentile(kind_ratios, 0.5),
            "forecast_ratio_p90": percentile(kind_ratios, 0.9),
        }
    return {
        "arrived": len(fates),
        "met": len(met),
        "goodput_rps": len(met) / seconds,
        "goodput_tokens_per_s": sum(_cost(f) for f in met) / seconds,
        "late_served": len(late),
        "late_engine_share": sum(f.arrival.service_s for f in late) / (seconds * SLOTS),
        "refusals": refusals,
        "refusal_ms_p50": percentile(decide_ms, 0.5),
        "refusal_ms_p99": percentile(decide_ms, 0.99),
        "refusal_ms_max": max(decide_ms, default=0.0),
        "refusal_cpu_ms_p50": percentile(decide_cpu_ms, 0.5),
        "refusal_cpu_ms_p99": percentile(decide_cpu_ms, 0.99),
        "refusal_cpu_ms_max": max(decide_cpu_ms, default=0.0),
        "forecast_n": len(ratios),
        "forecast_ratio_p50": percentile(ratios, 0.5),
        "forecast_ratio_p90": percentile(ratios, 0.9),
        "by_kind": by_kind,
    }


def _cost(fate: Any) -> int:
    return service_cost(fate.arrival.input_tokens, fate.arrival.output_tokens)


def markdown(results: dict[str, dict[str, Any]], seeds: int, duration: float) -> str:
    base = results["(a) fifo"]["goodput_rps"]
    lines = [
        f"{seeds} seeds x {duration:.0f} s simulated, {SLOTS} slots x {SLOT_RATE:.0f} weighted "
        "tokens/s, offered 2x capacity; MAX_QUEUE_DEPTH 256, QUEUE_TIMEOUT_MS 30000",
        "",
        "| set-up | deadline-met goodput (req/s) | vs (a) | met: interactive / batch "
        "| served too late (engine time) | refused on arrival | dropped when due |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        kinds = r["by_kind"]
        inter, batch = kinds["interactive"], kinds["batch"]
        refusals = r["refusals"]
        on_arrival = refusals.get("deadline_unreachable", 0) + refusals.get("queue_full", 0)
        dropped = sum(refusals.get(c, 0) for c in ("deadline_exceeded", "queue_timeout"))
        dropped += refusals.get("client_gone", 0)
        lines.append(
            f"| {name} | {r['goodput_rps']:.2f} | {r['goodput_rps'] / base:.2f}x "
            f"| {inter['met'] / inter['arrived']:.0%} / {batch['met'] / batch['arrived']:.0%} "
            f"| {r['late_served']} ({r['late_engine_share']:.0%}) | {on_arrival} | {dropped} |"
        )
    c = results["(c) deadlines"]
    kinds = c["by_kind"]
    lines += [
        "",
        f"(c): `deadline_unreachable` decided in p50 {1000 * c['refusal_ms_p50']:.0f} µs, "
        f"p99 {1000 * c['refusal_ms_p99']:.0f} µs, max {1000 * c['refusal_ms_max']:.0f} µs "
        f"wall time (CPU time: p50 {1000 * c['refusal_cpu_ms_p50']:.0f} µs, "
        f"p99 {1000 * c['refusal_cpu_ms_p99']:.0f} µs, "
        f"max {1000 * c['refusal_cpu_ms_max']:.0f} µs; "
        f"{c['refusals'].get('deadline_unreachable', 0)} refusals); forecast ÷ actual wait "
        f"over {c['forecast_n']} requests that waited: p50 {c['forecast_ratio_p50']:.2f}, "
        f"p90 {c['forecast_ratio_p90']:.2f} (interactive p50 "
        f"{kinds['interactive']['forecast_ratio_p50']:.2f} / p90 "
        f"{kinds['interactive']['forecast_ratio_p90']:.2f}; batch p50 "
        f"{kinds['batch']['forecast_ratio_p50']:.2f} / p90 "
        f"{kinds['batch']['forecast_ratio_p90']:.2f}).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--no-json", action="store_true")
    args = parser.parse_args()
    seeds = list(range(1, args.seeds + 1))
    traces = {seed: generate(seed, args.duration) for seed in seeds}
    results = {
        v.name: summarize([Replay(v, CONFIG, args.duration).run(traces[s]) for s in seeds])
        for v in VARIANTS
    }
    c, a = results["(c) deadlines"], results["(a) fifo"]
    targets = {
        "goodput_vs_fifo": (c["goodput_rps"] / a["goodput_rps"], TARGET_GOODPUT),
        "refusal_ms_p99": (c["refusal_ms_p99"], TARGET_REFUSAL_MS),
        "forecast_ratio_p50": (c["forecast_ratio_p50"], TARGET_FORECAST),
    }
    text = markdown(results, len(seeds), args.duration)
    met = [
        targets["goodput_vs_fifo"][0] >= TARGET_GOODPUT,
        targets["refusal_ms_p99"][0] <= TARGET_REFUSAL_MS,
        abs(targets["forecast_ratio_p50"][0] - 1) <= TARGET_FORECAST,
    ]
    print(text)
    print("\ntargets: goodput >= 1.3x (a), refusals <= 1 ms p99, forecast p50 +-25%:", met)
    if not args.no_json:
        out = ROOT / "bench" / "results" / f"deadlines-{time.strftime('%Y%m%d-%H%M%S')}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "seeds": seeds,
            "duration_s": args.duration,
            "machine": {"python": platform.python_version(), "platform": platform.platform()},
            "results": results,
            "targets_met": met,
            "load_average": os.getloadavg(),
        }
        out.write_text(json.dumps(doc, indent=2))
        print(f"raw results: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
