"""Fairness (P6) and overload (P4) of the scheduler, replayed on the real core.

    .venv/bin/python bench/fairness/run.py [--quick]

Part 1 replays the VTC paper's four synthetic workloads, `overload`,
`proportional`, on/off (both of the artifact's: `on_off_less`, `on_off_overload`)
and `poisson_short_long` (see `workloads.py`), through
`runner.scheduler.core.Scheduler` with a simulated clock and engine (`sim.py`):
once with VTC, once with FCFS (the same core with `fair=False`), once with VTC
whose admission estimate of output tokens is a blanket 512 (`max_tokens`)
corrected by the real usage at ServeDone. It reports how far backlogged tenants
fall behind (see `metrics.py`) and throughput, each as a ratio to FCFS.

Part 2 is the overload test: Poisson arrivals at 2x the engine's capacity with
the default limits (MAX_QUEUE_DEPTH 16, QUEUE_TIMEOUT_MS 30000): goodput versus
saturation, Retry-After values handed out, and the cost of deciding a 503 -
timed in process inside the replay, in a tight loop at a full queue, and end to
end through `SchedulerAdmission.acquire` on an asyncio loop.

Results go to `bench/results/fairness-<time>.json`; a Markdown table is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.fairness import metrics, workloads  # noqa: E402
from bench.fairness.sim import Replay  # noqa: E402
from runner.scheduler import QueueFull, SchedulerAdmission, SchedulerConfig  # noqa: E402
from runner.scheduler.core import Scheduler  # noqa: E402
from runner.scheduler.errors import SchedulerError  # noqa: E402
from runner.scheduler.events import RequestArrived, Ticket  # noqa: E402
from runner.scheduler.grants import AdmissionRequest  # noqa: E402

SLOTS = 8
CAPACITY = 1536.0  # weighted tokens/s: two 256+256 requests per second
UNBOUNDED = SchedulerConfig(max_queue_depth=10**9, queue_timeout_s=None, low_aging_s=None)


TARGET_DIFF_RATIO = 0.05
TARGET_THROUGHPUT_RATIO = 0.98


def fairness(name: str, arrivals: list[workloads.Arrival], duration: float) -> dict[str, Any]:
    tenants = {a.tenant for a in arrivals}
    runs: dict[str, dict[str, Any]] = {}
    variants = {
        "fcfs": (SchedulerConfig(**{**_fields(UNBOUNDED), "fair": False}), None),
        "vtc": (UNBOUNDED, None),
        "vtc_est512": (UNBOUNDED, 512),
    }
    for label, (config, estimate) in variants.items():
        replay = Replay(
            config, slots=SLOTS, capacity=CAPACITY, duration_s=duration, estimate_output=estimate
        )
        outcome = replay.run(arrivals)
        runs[label] = {
            "window_diff": metrics.windowed_diff(outcome, tenants),
            "interval_diff": metrics.interval_diff(outcome, tenants),
            "demand_diff": metrics.demand_diff(outcome, tenants, arrivals),
            "throughput": metrics.throughput(outcome),
        }
    fcfs = runs["fcfs"]
    for label in ("vtc", "vtc_est512"):
        run = runs[label]
        run["window_max_ratio"] = _div(run["window_diff"]["max"], fcfs["window_diff"]["max"])
        run["interval_ratio"] = _div(run["interval_diff"], fcfs["interval_diff"])
        run["demand_max_ratio"] = _div(run["demand_diff"]["max"], fcfs["demand_diff"]["max"])
        run["throughput_ratio"] = _div(run["throughput"], fcfs["throughput"])
        run["meets_target"] = (
            run["window_max_ratio"] <= TARGET_DIFF_RATIO
            and run["interval_ratio"] <= TARGET_DIFF_RATIO
            and run["throughput_ratio"] >= TARGET_THROUGHPUT_RATIO
        )
    return {
        "workload": name,
        "duration_s": duration,
        "requests": len(arrivals),
        "tenants": sorted(tenants),
        "runs": runs,
    }


WORKLOADS = (
    ("overload", workloads.overload, 360),
    ("proportional", workloads.proportional, 600),
    ("on_off_less", workloads.on_off_less, 600),
    ("on_off_overload", workloads.on_off_overload, 600),
    ("poisson_short_long", workloads.poisson_short_long, 600),
)


def _div(a: float, b: float) -> float:
    """a / b; nan when FCFS itself shows no difference (possible in `--quick` runs)."""
    return a / b if b else math.nan


def _fields(config: SchedulerConfig) -> dict[str, Any]:
    return {f: getattr(config, f) for f in SchedulerConfig.__dataclass_fields__}


def overload(duration: float) -> dict[str, Any]:
    saturation_rps = CAPACITY / 768
    arrivals = workloads.poisson_mix(2 * saturation_rps, duration, tenants=4)
    replay = Replay(SchedulerConfig(), slots=SLOTS, capacity=CAPACITY, duration_s=duration)
    outcome = replay.run(arrivals)
    stats = replay.core.stats(duration)
    ms = [ns / 1e6 for ns in outcome.reject_ns]
    return {
        "offered_rps": len(arrivals) / duration,
        "saturation_rps": saturation_rps,
        "goodput_ratio": metrics.throughput(outcome) / CAPACITY,
        "rejected": outcome.rejected,
        "reject_decision_ms": {
            "p50": metrics.percentile(ms, 0.5),
            "p99": metrics.percentile(ms, 0.99),
        },
        "final_p95_wait_ms": stats.p95_wait_ms,
        "retry_after_s": sorted(set(outcome.retry_after)),
    }


class _Sink:
    def grant(self, ticket: Ticket, queue_wait_ms: int) -> bool:
        return True

    def reject(self, ticket: Ticket, error: SchedulerError) -> None:
        return None


def reject_loop(n: int) -> dict[str, float]:
    """Time `n` arrivals refused at a full queue (16 waiting, 8 slots busy), one by one."""
    core = Scheduler(SchedulerConfig(default_concurrency=SLOTS), _Sink())
    req = AdmissionRequest("r", "m", "t", "normal", 256, 256)
    for i in range(SLOTS + 16):
        core.handle(RequestArrived(i, req, 0.0))
    samples: list[float] = []
    for i in range(n):
        event = RequestArrived(1000 + i, req, 1.0)
        started = time.perf_counter_ns()
        core.handle(event)
        samples.append((time.perf_counter_ns() - started) / 1e6)
    return {"p50": metrics.percentile(samples, 0.5), "p99": metrics.percentile(samples, 0.99)}


async def reject_end_to_end(n: int) -> dict[str, float]:
    """Time `await acquire()` until QueueFull, through the scheduler task, at a full queue."""
    adm = SchedulerAdmission(SchedulerConfig(default_concurrency=SLOTS, max_queue_depth=16))
    await adm.start()
    req = AdmissionRequest("r", "m", "t", "normal", 256, 256)
    holders = [asyncio.create_task(adm.acquire(req)) for _ in range(SLOTS + 16)]
    await asyncio.sleep(0)  # each acquire ran up to its await: the queue is full
    samples: list[float] = []
    for _ in range(n):
        started = time.perf_counter_ns()
        try:
            await adm.acquire(req)
        except QueueFull:
            samples.append((time.perf_counter_ns() - started) / 1e6)
    for task in holders:
        task.cancel()
    await adm.stop()
    return {"p50": metrics.percentile(samples, 0.5), "p99": metrics.percentile(samples, 0.99)}


def table(result: dict[str, Any]) -> str:
    lines = [
        "| workload | policy | max diff (tok/s, 60 s windows) | ratio to FCFS"
        " | max interval diff (tok) | ratio | artifact's shortfall (tok/s) | ratio"
        " | throughput (tok/s) | ratio | target |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for wl in result["fairness"]:
        for label, run in wl["runs"].items():
            verdict = ("met" if run["meets_target"] else "**missed**") if label != "fcfs" else ""
            lines.append(
                f"| {wl['workload']} | {label} | {run['window_diff']['max']:.1f}"
                f" | {_ratio(run, 'window_max_ratio')} | {run['interval_diff']:.0f}"
                f" | {_ratio(run, 'interval_ratio')} | {run['demand_diff']['max']:.1f}"
                f" | {_ratio(run, 'demand_max_ratio')} | {run['throughput']:.1f}"
                f" | {_ratio(run, 'throughput_ratio')} | {verdict} |"
            )
    ov = result["overload"]
    lines += [
        "",
        "| overload (2x capacity, depth 16, timeout 30 s) | value |",
        "|---|---:|",
        f"| offered / saturation (req/s) | {ov['offered_rps']:.2f} / {ov['saturation_rps']:.2f} |",
        f"| goodput / saturation | {ov['goodput_ratio']:.3f} |",
        f"| refused (by code) | {ov['rejected']} |",
        f"| Retry-After values seen (s) | {ov['retry_after_s']} |",
        f"| 503 decision in replay, p50 / p99 (ms) | {_ms(ov['reject_decision_ms'])} |",
        f"| 503 decision, tight loop, p50 / p99 (ms) | {_ms(result['reject_loop_ms'])} |",
        f"| 503 via `acquire()` on asyncio, p50 / p99 (ms) | {_ms(result['reject_e2e_ms'])} |",
    ]
    return "\n".join(lines)


def _ratio(run: dict[str, Any], key: str) -> str:
    return f"{run[key]:.3f}" if key in run else "1"


def _ms(d: dict[str, float]) -> str:
    return f"{d['p50']:.4f} / {d['p99']:.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs (smoke test)")
    args = parser.parse_args()
    scale = 0.25 if args.quick else 1.0
    n = 2_000 if args.quick else 20_000

    result = {
        "fairness": [
            fairness(name, make(duration_s=seconds * scale), seconds * scale)
            for name, make, seconds in WORKLOADS
        ],
        "overload": overload(600 * scale),
        "reject_loop_ms": reject_loop(n),
        "reject_e2e_ms": asyncio.run(reject_end_to_end(n)),
    }
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"fairness-{time.strftime('%Y%m%dT%H%M%S')}.json"
    meta = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "slots": SLOTS,
        "capacity_tok_s": CAPACITY,
        "quick": args.quick,
    }
    path.write_text(json.dumps({"meta": meta, **result}, indent=2) + "\n")
    print(table(result))
    print(f"\nwritten: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
