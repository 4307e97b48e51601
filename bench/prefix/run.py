"""P11 (prefix reuse with tenant isolation) and P1 on the real engine: runner vs llama-server.

    .venv/bin/python -m bench.prefix.run [--quick] [--reps 3] [--parallel 2] [--threads 1]
        [--tenants 4] [--sessions 3] [--turns 4] [--no-throughput]

What it does:
1. builds a seeded multi-tenant, multi-turn chat trace (`bench/prefix/trace.py`);
2. replays it `--reps` times on each system, interleaved (R D, D R, ...), each run on
   freshly started engines so no run inherits another's cache:
   - runner: `python -m runner`, multi-tenant, starting its own llama-server from a models
     file (closed shared caches, slots chosen per tenant by the runner);
   - direct: the same llama-server binary and GGUF started by hand with its defaults (same
     `--parallel` and `--ctx-size`; so the RAM prompt cache and similarity slot choice are on);
   - with `--systems runner,direct,direct-noram` also the defaults but `--cache-ram 0`, to
     show what the shared RAM prompt cache alone contributes;
   `--threads` (default 1) goes to both engines alike: llama.cpp's default of one thread per
   core spin-waits at barriers and collapses when other jobs share this machine's 2 cores;
3. throughput: runner and direct side by side, `--tp-pairs` interleaved pairs of closed-loop
   runs with `--tp-clients` clients sending short prompts (the same requests in a pair);
4. tokenizes every prompt with the engine's own `/apply-template` + `/tokenize` and counts
   cross-tenant hits (`bench/prefix/analysis.py` says how);
5. prints a Markdown table and writes `bench/results/prefix-<time>.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from types import FrameType
from typing import Any

from bench.prefix import analysis, report
from bench.prefix.client import closed_loop, replay
from bench.prefix.engines import LLAMA_BIN, require_engine, start_direct, start_system
from bench.prefix.trace import Request, TraceConfig, build_trace
from bench.proxy.procs import REPO_ROOT, loadavg, machine_facts


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_trace(
    system: str, rep: int, trace: list[Request], args: argparse.Namespace
) -> dict[str, Any]:
    parallel = args.runner_parallel if system == "runner" else args.parallel
    with start_system(system, parallel, args.ctx, args.engine_args) as served:
        load0 = loadavg()
        t0 = time.monotonic()
        outcomes = asyncio.run(replay(served.url, served.model, trace, args.concurrency))
        wall = time.monotonic() - t0
    return {
        "system": system,
        "rep": rep,
        "label": f"{system}#{rep}",
        "wall_s": wall,
        "loadavg": [load0, loadavg()],
        "outcomes": outcomes,
    }


def _p50(values: list[float]) -> float:
    return analysis.percentile(values, 50)


def run_throughput(args: argparse.Namespace) -> dict[str, Any]:
    """Interleaved closed-loop pairs, runner and direct both up (the idle one costs nothing)."""
    pairs: list[dict[str, Any]] = []
    with (
        start_system("runner", args.parallel, args.ctx, args.engine_args) as runner,
        start_system("direct", args.parallel, args.ctx, args.engine_args) as direct,
    ):
        urls = {"runner": runner.url, "direct": direct.url}
        for side in ("direct", "runner"):  # warm-up, not counted
            asyncio.run(closed_loop(urls[side], "gemma", args.tp_clients, args.tenants, 2.0, 10**6))
        for i in range(args.tp_pairs):
            order = ("direct", "runner") if i % 2 == 0 else ("runner", "direct")
            pair: dict[str, Any] = {"order": order, "loadavg": loadavg()}
            for side in order:
                res = asyncio.run(
                    closed_loop(
                        urls[side],
                        "gemma",
                        args.tp_clients,
                        args.tenants,
                        args.tp_duration,
                        i * 10**4,
                    )
                )
                res["p50_ms"] = _p50(res.pop("latencies_ms"))
                pair[side] = res
            _log(
                f"throughput pair {i + 1}: direct {pair['direct']['rps']:.2f} req/s, "
                f"runner {pair['runner']['rps']:.2f} req/s"
            )
            pairs.append(pair)
    return {
        "clients": args.tp_clients,
        "tenants": args.tenants,
        "duration_s": args.tp_duration,
        "pairs": len(pairs),
        "runs": pairs,
        "summary": report.throughput_ratios(pairs),
    }


def analyse(
    trace: list[Request], runs: list[dict[str, Any]], args: argparse.Namespace
) -> dict[str, Any]:
    """Tokenize on a spare direct engine; add per-request hits and a summary to each run;
    return the trace's facts (template opening, token count checks, system prompt size)."""
    outcomes = {run["label"]: run["outcomes"] for run in runs}
    with start_direct(1, args.ctx, args.engine_args) as tok:
        prompt_tokens, seen, mismatches = asyncio.run(
            analysis.token_lists(tok.url, trace, outcomes)
        )
    firsts: dict[str, list[int]] = {}
    for req in trace:
        if not req.probe:
            firsts.setdefault(req.tenant, prompt_tokens[req.index])
    public = analysis.public_len(firsts)
    for run in runs:
        hits = analysis.cross_tenant(run["outcomes"], prompt_tokens, seen, run["label"], public)
        run["summary"] = analysis.summarize_run(run["outcomes"], hits, run["wall_s"])
        run["hits"] = [h for h in hits if h["raw_hit"]]
        run["outcomes"] = [o.as_dict() for o in run["outcomes"]]
    system_tokens = round(
        sum(len(prompt_tokens[r.index]) for r in trace if r.turn == 1 and not r.probe)
        / max(1, sum(r.turn == 1 and not r.probe for r in trace))
    )
    return {
        "requests": len(trace),
        "probes": sum(r.probe for r in trace),
        "public_len": public,
        "token_count_mismatches": mismatches,
        "system_tokens": system_tokens,
    }


def engine_version() -> str:
    try:
        out = subprocess.run([LLAMA_BIN, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    text = (out.stdout + out.stderr).strip().splitlines()
    line = next((t for t in text if t.startswith("version:")), "")
    return line.removeprefix("version:").strip() or "unknown"


SIZES = (
    ("reps", 3, 1),
    ("sessions", 3, 2),
    ("turns", 3, 3),
    ("tp_duration", 15.0, 8.0),
    ("tp_pairs", 3, 1),
)
"""(option, full run, --quick) for the options that size a run."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.prefix.run", description=__doc__)
    p.add_argument("--quick", action="store_true", help="1 repetition, smaller trace (~3 min)")
    p.add_argument("--reps", type=int, default=None, help="3 (--quick: 1)")
    p.add_argument("--parallel", type=int, default=2, help="engine slots (both systems)")
    p.add_argument("--ctx", type=int, default=2048, help="context per slot")
    p.add_argument("--threads", type=int, default=1, help="engine threads (0: its default)")
    p.add_argument("--concurrency", type=int, default=None, help="default: --parallel")
    p.add_argument(
        "--runner-parallel",
        type=int,
        default=None,
        help="diagnostic: the runner's slots in the trace runs (default: --parallel); "
        "more slots than requests in flight keep more tenants' prompts",
    )
    p.add_argument("--tenants", type=int, default=4)
    p.add_argument("--sessions", type=int, default=None, help="per tenant: 3 (--quick: 2)")
    p.add_argument("--turns", type=int, default=None, help="per session: 3")
    p.add_argument("--open-sessions", type=int, default=6)
    p.add_argument("--probes", type=int, default=4)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--tp-clients", type=int, default=4)
    p.add_argument("--tp-duration", type=float, default=None, help="s per run: 15 (--quick: 8)")
    p.add_argument("--tp-pairs", type=int, default=None, help="3 (--quick: 1)")
    p.add_argument("--system-sentences", type=int, default=16, help="~19 tokens each")
    p.add_argument(
        "--systems",
        default="runner,direct",
        help="comma-separated: runner, direct, direct-noram (diagnostic: --cache-ram 0)",
    )
    p.add_argument("--no-throughput", action="store_true")
    args = p.parse_args(argv)
    for name, full, quick in SIZES:  # --quick changes only what was not given
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    args.concurrency = args.concurrency or args.parallel
    args.runner_parallel = args.runner_parallel or args.parallel
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if "runner" not in args.systems or "direct" not in args.systems:
        p.error("--systems must include runner and direct")
    args.engine_args = ["--threads", str(args.threads)] if args.threads > 0 else []
    return args


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    require_engine()
    signal.signal(signal.SIGTERM, _sigterm)
    cfg = TraceConfig(
        tenants=args.tenants,
        sessions_per_tenant=args.sessions,
        turns=args.turns,
        open_sessions=args.open_sessions,
        probes=args.probes,
        system_sentences=args.system_sentences,
        seed=args.seed,
    )
    trace = build_trace(cfg)
    started = datetime.now(UTC)
    facts = machine_facts()
    result: dict[str, Any] = {
        "started": started.strftime("%Y-%m-%d %H:%M UTC"),
        "command": ".venv/bin/python -m bench.prefix.run " + " ".join(sys.argv[1:]),
        "machine": {
            "nproc": facts["nproc"],
            "cpu": facts["cpu"],
            "python": facts["python"],
            "git_head": facts["git_head"],
            "uncommitted": facts["uncommitted_in_tested_code"],
        },
        "engine": {"bin": LLAMA_BIN, "version": engine_version()},
        "config": {
            **asdict(cfg),
            "parallel": args.parallel,
            "runner_parallel": args.runner_parallel,
            "ctx_per_slot": args.ctx,
            "concurrency": args.concurrency,
            "engine_args": args.engine_args,
            "reps": args.reps,
            "systems": args.systems,
        },
        "loadavg_before": loadavg(),
        "runs": [],
    }
    _log(f"trace: {len(trace)} requests; load average {result['loadavg_before']}")
    try:
        for rep in range(args.reps):
            order = args.systems if rep % 2 == 0 else args.systems[::-1]
            for system in order:
                run = run_trace(system, rep, trace, args)
                errors = sum(o.status != 200 for o in run["outcomes"])
                _log(f"rep {rep + 1} {system}: {run['wall_s']:.1f} s, {errors} errors")
                result["runs"].append(run)
        if not args.no_throughput:
            result["throughput"] = run_throughput(args)
        _log("tokenizing prompts for the cross-tenant analysis")
        result["trace"] = analyse(trace, result["runs"], args)
    except KeyboardInterrupt:
        _log("interrupted; everything started was stopped")
        return 130
    result["ratios"] = report.pair_ratios(result["runs"])
    if "direct-noram" in args.systems:
        result["ratios_vs_noram"] = report.pair_ratios(result["runs"], "direct-noram")
    result["loadavg_after"] = loadavg()
    out_dir = REPO_ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"prefix-{started.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=1))
    print("\n" + report.markdown(result) + "\n")
    _log(f"wrote {out.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
