"""Swap efficiency (P5): the runner's scheduler on replayed multi-model traces.

    .venv/bin/python -m bench.swap.run [--seeds 5] [--hours 2] [--levels heavy,medium,light]

Replays the seeded traces of `trace.py` (7 models in 48 GB, 12 tenants in
three priority bands, bursty sessions alternating between models) at three
levels of contention - the mean idle time between a tenant's sessions is 4
(heavy), 8 (medium) or 12 (light) minutes - on the simulated machine of
`sim.py`, with:

- `ours`: the real `runner.scheduler` core and eviction policy, default config;
- `ours, no batching`: the same with `swap_max_wait_s=0` (what batching buys);
- `fifo`, `lru`: the baselines of `baselines.py`;
- Belady's offline optimum on the order ours served the requests in (the
  lower bound for that service order: how far ours' evictions are from
  clairvoyant ones), and on the arrival order (the best any policy serving
  in arrival order could do).

No queue timeout and no queue cap: every request is served, so waits compare.
Per level it sums loads and cold-load seconds over the seeds, pools the waits
for the percentiles, and checks the targets (PERFORMANCE.md P5): ours' loads
<= 1.15x Belady's, >= 30% fewer than FIFO's, p95 wait of `high` requests no
worse than FIFO's. Prints Markdown; raw results go to
`bench/results/swap-<time>.json` (`--no-json` to skip).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

from bench.swap.baselines import Fifo, Lru, arrival_order, belady
from bench.swap.sim import Machine, Ours, Outcome, Policy, percentile
from bench.swap.trace import Trace, generate

ROOT = Path(__file__).resolve().parents[2]
LEVELS = {"heavy": 240.0, "medium": 480.0, "light": 720.0}  # mean gap between sessions, s
POLICIES = {
    "ours": "ours (runner scheduler)",
    "ours_no_batching": "ours, no batching",
    "fifo": "FIFO swapping (llama-swap before #823)",
    "lru": "LRU, no batching (Ollama-like)",
}
BANDS = ("high", "normal", "low")


def policies(trace: Trace) -> dict[str, Policy]:
    return {
        "ours": Ours(trace),
        "ours_no_batching": Ours(trace, swap_max_wait_s=0.0),
        "fifo": Fifo(),
        "lru": Lru(),
    }


def replay(trace: Trace, policy: Policy) -> Outcome:
    outcome = Machine(trace, policy).run()
    assert set(outcome.granted) | set(outcome.rejected) == {r.rid for r in trace.requests}
    return outcome


def level(name: str, gap_s: float, seeds: list[int], hours: float) -> dict[str, Any]:
    """Replay every seed at this level; sum loads, pool waits."""
    per_seed: list[dict[str, Any]] = []
    waits: dict[str, dict[str, list[float]]] = {p: {b: [] for b in BANDS} for p in POLICIES}
    totals: dict[str, dict[str, float]] = {
        p: {"loads": 0, "cold_load_s": 0.0, "rejected": 0} for p in POLICIES
    }
    optimum = {"belady_ours_order": [0, 0.0], "belady_arrival_order": [0, 0.0]}
    requests = 0
    for seed in seeds:
        trace = generate(seed, hours * 3600.0, mean_gap_s=gap_s)
        requests += len(trace.requests)
        seed_doc: dict[str, Any] = {"seed": seed, "requests": len(trace.requests), "runs": {}}
        for key, policy in policies(trace).items():
            outcome = replay(trace, policy)
            summary = outcome.summary(trace.requests)
            seed_doc["runs"][key] = summary
            totals[key]["loads"] += summary["loads"]
            totals[key]["cold_load_s"] += outcome.load_seconds()
            totals[key]["rejected"] += summary["rejected"]
            for band in BANDS:
                waits[key][band] += outcome.waits(trace.requests, band)
            if key == "ours":
                seed_doc["belady_ours_order"] = belady(outcome.order, trace)
        seed_doc["belady_arrival_order"] = belady(arrival_order(trace.requests), trace)
        for which in optimum:
            loads, seconds = seed_doc[which]
            optimum[which][0] += loads
            optimum[which][1] += seconds
        per_seed.append(seed_doc)
    runs = {
        key: {
            "loads": int(t["loads"]),
            "cold_load_s": round(t["cold_load_s"], 1),
            "rejected": int(t["rejected"]),
            **{f"p95_wait_s_{b}": round(percentile(sorted(waits[key][b]), 0.95), 1) for b in BANDS},
            **{f"p50_wait_s_{b}": round(percentile(sorted(waits[key][b]), 0.50), 1) for b in BANDS},
        }
        for key, t in totals.items()
    }
    ours, fifo = runs["ours"], runs["fifo"]
    own, arrival = optimum["belady_ours_order"][0], optimum["belady_arrival_order"][0]
    vs_belady = round(ours["loads"] / own, 3)
    fewer = round(1 - ours["loads"] / fifo["loads"], 3)
    checks: dict[str, Any] = {
        "loads_vs_belady_ours_order": vs_belady,
        "loads_vs_belady_arrival_order": round(ours["loads"] / arrival, 3),
        "fewer_loads_than_fifo": fewer,
        "p95_high_ours_s": ours["p95_wait_s_high"],
        "p95_high_fifo_s": fifo["p95_wait_s_high"],
        "per_seed_vs_belady_ours_order": [
            round(s["runs"]["ours"]["loads"] / s["belady_ours_order"][0], 3) for s in per_seed
        ],
        "per_seed_fewer_than_fifo": [
            round(1 - s["runs"]["ours"]["loads"] / s["runs"]["fifo"]["loads"], 3) for s in per_seed
        ],
    }
    checks["met"] = {
        "belady": vs_belady <= 1.15,
        "fifo_30pct": fewer >= 0.30,
        "p95_high": ours["p95_wait_s_high"] <= fifo["p95_wait_s_high"],
    }
    return {
        "level": name,
        "mean_gap_s": gap_s,
        "seeds": seeds,
        "hours": hours,
        "requests": requests,
        "runs": runs,
        "belady_ours_order": {"loads": own, "cold_load_s": round(optimum["belady_ours_order"][1])},
        "belady_arrival_order": {
            "loads": arrival,
            "cold_load_s": round(optimum["belady_arrival_order"][1]),
        },
        "checks": checks,
        "per_seed": per_seed,
    }


def table(result: dict[str, Any]) -> str:
    runs, checks = result["runs"], result["checks"]
    own = result["belady_ours_order"]
    arrival = result["belady_arrival_order"]
    seeds = result["seeds"]
    lines = [
        f"**{result['level']}** (mean gap between a tenant's sessions "
        f"{result['mean_gap_s'] / 60:g} min; seeds {seeds[0]}-{seeds[-1]}, "
        f"{result['hours']:g} h each, {result['requests']} requests)",
        "",
        "| policy | loads | / Belady (ours' order) | cold-load s "
        "| p95 wait high / normal / low (s) | p50 wait high / normal / low (s) |",
        "|---|---:|---:|---:|---|---|",
    ]
    for key, label in POLICIES.items():
        r = runs[key]
        lines.append(
            f"| {label} | {r['loads']} | {r['loads'] / own['loads']:.2f}x "
            f"| {r['cold_load_s']:.0f} | "
            + " / ".join(f"{r[f'p95_wait_s_{b}']:.1f}" for b in BANDS)
            + " | "
            + " / ".join(f"{r[f'p50_wait_s_{b}']:.1f}" for b in BANDS)
            + " |"
        )
    lines += [
        f"| Belady, ours' service order (offline) | {own['loads']} | 1.00x "
        f"| {own['cold_load_s']:.0f} | - | - |",
        f"| Belady, arrival order (offline) | {arrival['loads']} "
        f"| {arrival['loads'] / own['loads']:.2f}x | {arrival['cold_load_s']:.0f} | - | - |",
        "",
    ]
    met = checks["met"]
    per_belady = ", ".join(f"{x:.2f}" for x in checks["per_seed_vs_belady_ours_order"])
    per_fifo = ", ".join(f"{100 * x:.1f}%" for x in checks["per_seed_fewer_than_fifo"])
    lines += [
        f"- loads / Belady (ours' order): {checks['loads_vs_belady_ours_order']:.3f}x, target "
        f"<= 1.15x: {_mark(met['belady'])} (per seed: {per_belady}); / Belady (arrival "
        f"order): {checks['loads_vs_belady_arrival_order']:.3f}x",
        f"- loads vs FIFO: {100 * checks['fewer_loads_than_fifo']:.1f}% fewer, target >= 30%: "
        f"{_mark(met['fifo_30pct'])} (per seed: {per_fifo})",
        f"- p95 wait of high requests: {checks['p95_high_ours_s']:.1f} s vs FIFO's "
        f"{checks['p95_high_fifo_s']:.1f} s, target no worse: {_mark(met['p95_high'])}",
    ]
    return "\n".join(lines)


def _mark(ok: bool) -> str:
    return "met" if ok else "**missed**"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1, help="first seed")
    parser.add_argument("--seeds", type=int, default=5, help="how many seeds per level")
    parser.add_argument("--hours", type=float, default=2.0, help="trace length per seed")
    parser.add_argument("--levels", default=",".join(LEVELS), help="heavy,medium,light")
    parser.add_argument("--no-json", action="store_true")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    seeds = list(range(args.seed, args.seed + args.seeds))
    results = [level(name, LEVELS[name], seeds, args.hours) for name in args.levels.split(",")]
    print("## Swap efficiency (P5)\n")
    for result in results:
        print(table(result))
        print()
    elapsed = time.perf_counter() - started
    print(f"replayed in {elapsed:.1f} s")
    if not args.no_json:
        out = ROOT / "bench" / "results" / f"swap-{time.strftime('%Y%m%dT%H%M%S')}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "args": vars(args),
            "python": platform.python_version(),
            "elapsed_s": round(elapsed, 1),
            "results": results,
        }
        out.write_text(json.dumps(doc, indent=1))
        print(f"written: {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
