"""P16: does a client that comes back after exactly `Retry-After` get in, and did it wait
longer than it had to? Through HTTP, on the real runner, against any commits.

    .venv/bin/python -m bench.retryafter.run [--ref main] [--ref HEAD] [--policy proposal]
        [--scenarios spikes,bursts,ratelimit] [--reps 1] [--quick]

What it does (everything on 127.0.0.1, each piece its own process):
1. starts the fake OpenAI engine (`tests/fixtures/fake_openai.py`) with a fixed 270 ms
   latency; the runner attaches it with `parallel: 1`, so the engine completes 3.7
   requests per second (a ComfyUI-like single queue: 16 waiting drain in 4.3 s);
2. for each scenario and repetition, for each variant in turn (interleaved): starts a
   fresh runner from that variant's code, with the scenario's limits, and replays the
   scenario's trace (`trace.py`) with `client.py`: open loop, every client refused with
   503 `queue_full` or 429 comes back after exactly its `Retry-After` (up to 8 times);
3. analyses every attempt (`analysis.py`): the share of returns admitted, and the
   over-wait (`Retry-After` / the whole seconds it actually had to wait for a place);
4. writes `bench/results/retryafter-<time>.json` and prints the tables for
   docs/benchmarks.md ("Retry-After (P16)").

Variants: each `--ref` runs that commit's runner as it is (`python -m runner` from its
packages, as bench/overload does); each `--policy NAME` adds the first ref's runner with
the scheduler core's `Retry-After` replaced by `policies.NAME` (the experiment in
`proposal_runner.py`), so a proposal can be measured before it is written into the runner.

Scenarios: `spikes` (the headline: a batch of 20-40 requests at once every 20 s over a
0.4x background; default limits, `MAX_QUEUE_DEPTH` 16), `bursts` (3x capacity for 6 s,
0.25x for 24 s: sustained overload, where no `Retry-After` can be right), `ratelimit` (the
spikes trace with `TENANT_RATE_LIMIT_t3=10req/s` and a queue deep enough never to
refuse: only 429s). Targets: admitted on return >= 80%, median over-wait <= 2x.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from bench.proxy.procs import (
    REPO_ROOT,
    code_snapshot,
    loadavg,
    machine_facts,
    resolve_ref,
    start_runner,
)
from bench.retryafter import analysis, policies, trace
from tests.fixtures.launch import start_fake

LATENCY_MS = 270
PARALLEL = 1
CAPACITY = PARALLEL * 1000 / LATENCY_MS
TARGET_ADMITTED = 0.80
TARGET_OVER_WAIT = 2.0


@dataclass(frozen=True)
class Scenario:
    trace: str
    cycles: int
    env: dict[str, str] = field(default_factory=dict)
    max_depth: int = 16
    rates: dict[str, str] = field(default_factory=dict)


SCENARIOS = {
    "spikes": Scenario("spikes", 6),
    "bursts": Scenario("bursts", 4),
    "ratelimit": Scenario(
        "spikes",
        6,
        {"TENANT_RATE_LIMIT_t3": "10req/s", "MAX_QUEUE_DEPTH": "1000"},
        1000,
        {"t3": "10req/s"},
    ),
}


@dataclass(frozen=True)
class Variant:
    label: str
    code_dir: Path
    policy: str | None  # None: the runner as it is


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def one_run(
    engine_url: str, variant: Variant, scenario: Scenario, seed: int, cycles: int
) -> dict[str, Any]:
    """A fresh runner of `variant`, the scenario's trace through it, the analysis."""
    env = dict(scenario.env)
    module = "runner"
    if variant.policy is not None:
        module = "bench.retryafter.proposal_runner"
        env["PYTHONPATH"] = str(REPO_ROOT)
        env["RETRYAFTER_POLICY"] = variant.policy
    end_s = trace.duration_s(scenario.trace, cycles)
    with (
        start_runner(
            engine_url, PARALLEL, variant.code_dir, env=env, module=module, log_format="text"
        ) as runner,
        tempfile.TemporaryDirectory(prefix="bench-retryafter-") as tmp,
    ):
        out = Path(tmp) / "attempts.json"
        cmd = [sys.executable, "-m", "bench.retryafter.client", "--url", runner.url]
        cmd += ["--trace", scenario.trace, "--capacity", f"{CAPACITY:.4f}"]
        cmd += ["--cycles", str(cycles), "--seed", str(seed), "--out", str(out)]
        subprocess.run(cmd, cwd=REPO_ROOT, check=True, timeout=end_s + 300)
        data = json.loads(out.read_text())
    attempts = [analysis.Attempt(**a) for a in data["attempts"]]
    result = analysis.analyse(
        attempts, scenario.max_depth, end_s, scenario.rates, data["wall_start"]
    )
    result["codes"] = _codes(attempts)
    result["raw"] = data  # every attempt, to analyse again
    return result


def _codes(attempts: list[analysis.Attempt]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for a in attempts:
        key = str(a.status) if a.status == 200 else f"{a.status} {a.code}".strip()
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repetitions of the headline figures, and the verdict."""

    def med(values: list[float]) -> float:
        values = [v for v in values if v == v]  # drop nan
        return statistics.median(values) if values else float("nan")

    admitted = med([r["admitted_on_return"] for r in runs])
    over = med([r["over_wait"]["p50"] for r in runs])
    return {
        "admitted_on_return": admitted,
        "over_wait_p50": over,
        "over_wait_p90": med([r["over_wait"]["p90"] for r in runs]),
        "meets_targets": admitted >= TARGET_ADMITTED and over <= TARGET_OVER_WAIT,
    }


def _fmt(x: float, pct: bool = False) -> str:
    if x != x:
        return "-"
    return f"{100 * x:.0f}%" if pct else f"{x:.2f}"


def _range(v: dict[str, Any], get: Any, pct: bool = False) -> str:
    """Median over repetitions, with (min-max) when there are several."""
    values = [x for x in (get(r) for r in v["runs"]) if x == x]
    if not values:
        return "-"
    text = _fmt(statistics.median(values), pct)
    if len(values) > 1:
        text += f" ({_fmt(min(values), pct)}-{_fmt(max(values), pct)})"
    return text


def _med_runs(v: dict[str, Any], key: str, q: str) -> float:
    values = [r[key][q] for r in v["runs"] if r[key][q] == r[key][q]]
    return statistics.median(values) if values else float("nan")


def _by_code(v: dict[str, Any]) -> str:
    by: dict[str, list[float]] = {}
    for r in v["runs"]:
        for k, x in r["admitted_on_return_by_code"].items():
            by.setdefault(k, []).append(x)
    return "; ".join(f"{k}: {_fmt(statistics.median(xs), pct=True)}" for k, xs in by.items())


def _given(v: dict[str, Any]) -> str:
    total: dict[str, dict[int, int]] = {}
    for r in v["runs"]:
        for k, c in r["retry_after_given"].items():
            for s, n in c.items():
                total.setdefault(k, {})[int(s)] = total.get(k, {}).get(int(s), 0) + n
    return "; ".join(
        f"{k}: " + ", ".join(f"{s}: {n}" for s, n in sorted(c.items())) for k, c in total.items()
    )


ROWS: list[tuple[str, Any]] = [
    ("answers (all attempts, all repetitions)", lambda v: _counts(v["runs"], "codes")),
    ("refusals that came back (all repetitions)", lambda v: _counts(v["runs"], "refusals")),
    ("**admitted on return**", lambda v: _range(v, lambda r: r["admitted_on_return"], pct=True)),
    ("admitted on return, by code", _by_code),
    ("**over-wait p50**", lambda v: _range(v, lambda r: r["over_wait"]["p50"])),
    ("over-wait p90", lambda v: _range(v, lambda r: r["over_wait"]["p90"])),
    (
        "over-wait in line p50 / p90 (`queue_full`)",
        lambda v: (
            _fmt(_med_runs(v, "over_wait_in_line_queue_full", "p50"))
            + " / "
            + _fmt(_med_runs(v, "over_wait_in_line_queue_full", "p90"))
        ),
    ),
    (
        "needed (whole s) p50, median",
        lambda v: _fmt(statistics.median(r["needed_whole_s"]["p50"] for r in v["runs"])),
    ),
    ("Retry-After given (s: count)", _given),
    (
        "clients finally admitted",
        lambda v: (
            f"{sum(r['admitted_finally'] for r in v['runs'])}"
            f" / {sum(r['clients'] for r in v['runs'])}"
        ),
    ),
    (
        "targets (>= 80%, <= 2x)",
        lambda v: "met" if v["summary"]["meets_targets"] else "**missed**",
    ),
]


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Run {result['started']}, {result['machine']['nproc']} cores, Python "
        f"{result['machine']['python']}; load average before {result['loadavg_before']}, "
        f"after {result.get('loadavg_after')}.",
        "",
        f"    {result['command']}",
    ]
    labels = [v["label"] for v in result["variants"]]
    for name, per_variant in result["scenarios"].items():
        lines += ["", f"**{name}**", ""]
        lines.append("| figure | " + " | ".join(labels) + " |")
        lines.append("|---|" + "---:|" * len(labels))
        for title, fn in ROWS:
            cells = [fn(per_variant[label]) for label in labels]
            lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _counts(runs: list[dict[str, Any]], key: str) -> str:
    total: dict[str, int] = {}
    for r in runs:
        for k, n in r[key].items():
            total[k] = total.get(k, 0) + n
    return ", ".join(f"{k}: {n}" for k, n in total.items()) or "-"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="P16: Retry-After that holds, through HTTP")
    p.add_argument("--ref", action="append", help="a commit to run the runner from (repeat)")
    p.add_argument(
        "--policy",
        action="append",
        default=[],
        choices=sorted(policies.POLICIES),
        help="also run the first ref with this Retry-After policy in its core (repeat)",
    )
    p.add_argument("--scenarios", default="spikes,bursts,ratelimit")
    p.add_argument("--reps", type=int, default=1, help="repetitions (seeds 1..reps)")
    p.add_argument("--cycles", type=int, default=None, help="override each scenario's cycles")
    p.add_argument("--quick", action="store_true", help="2 cycles, spikes only")
    args = p.parse_args(argv)
    args.ref = args.ref or ["HEAD"]
    if args.quick:
        args.cycles, args.scenarios = 2, "spikes"
    unknown = set(args.scenarios.split(",")) - set(SCENARIOS)
    if unknown:
        p.error(f"unknown scenarios: {sorted(unknown)}")
    return args


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    started = datetime.now(UTC)
    result: dict[str, Any] = {
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "command": ".venv/bin/python -m bench.retryafter.run " + " ".join(sys.argv[1:]),
        "machine": machine_facts(),
        "engine": {"latency_ms": LATENCY_MS, "parallel": PARALLEL, "capacity_rps": CAPACITY},
        "loadavg_before": loadavg(),
        "variants": [],
        "scenarios": {},
    }
    with contextlib.ExitStack() as stack:
        variants: list[Variant] = []
        for ref in args.ref:
            code_dir = stack.enter_context(code_snapshot(ref))
            variants.append(Variant(f"{ref} ({resolve_ref(ref)})", code_dir, None))
        for name in args.policy:
            first = variants[0]
            variants.append(Variant(f"{first.label} + {name}", first.code_dir, name))
        result["variants"] = [{"label": v.label, "policy": v.policy} for v in variants]
        engine = stack.enter_context(start_fake("fake_openai", "--latency-ms", str(LATENCY_MS)))
        for name in args.scenarios.split(","):
            scenario = SCENARIOS[name]
            cycles = args.cycles or scenario.cycles
            per: dict[str, Any] = {v.label: {"runs": []} for v in variants}
            for seed in range(1, args.reps + 1):
                for v in variants:
                    res = one_run(engine.url, v, scenario, seed, cycles)
                    per[v.label]["runs"].append(res)
                    _log(
                        f"{name} seed {seed} {v.label}: admitted on return "
                        f"{_fmt(res['admitted_on_return'], pct=True)}, over-wait p50 "
                        f"{_fmt(res['over_wait']['p50'])}, refusals {res['refusals']}"
                    )
            for v in variants:
                per[v.label]["summary"] = summarize(per[v.label]["runs"])
            result["scenarios"][name] = per
    result["loadavg_after"] = loadavg()
    out_dir = REPO_ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"retryafter-{started.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=1))
    print("\n" + markdown(result) + "\n")
    _log(f"wrote {out.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
