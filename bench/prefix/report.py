"""Pairs of runs into ratios, and the Markdown table (P11, and P1 on the real engine).

Every ratio is runner ÷ direct within one interleaved pair (one repetition), then the
median over pairs with the spread [min, max]. Verdicts are decided on the median.
"""

from __future__ import annotations

import statistics
from typing import Any

TARGETS = {"reuse": 0.9, "ttft_p50": 1.1, "throughput": 0.97}
LABELS = {
    "direct": "llama-server by hand, defaults",
    "direct-noram": "llama-server by hand, defaults but --cache-ram 0 (diagnostic)",
    "runner": "runner (multi-tenant)",
}


def spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def pair_ratios(runs: list[dict[str, Any]], base: str = "direct") -> dict[str, Any]:
    """Runner ÷ `base` per repetition for reuse and TTFT, then median and spread."""
    by_rep: dict[int, dict[str, dict[str, Any]]] = {}
    for run in runs:
        by_rep.setdefault(run["rep"], {})[run["system"]] = run["summary"]
    reuse, p50, p95 = [], [], []
    for pair in by_rep.values():
        if "runner" not in pair or base not in pair:
            continue
        r, d = pair["runner"], pair[base]
        reuse.append(_ratio(r["reused_tokens"], d["reused_tokens"]))
        p50.append(_ratio(r["ttft_p50_ms"], d["ttft_p50_ms"]))
        p95.append(_ratio(r["ttft_p95_ms"], d["ttft_p95_ms"]))
    return {"reuse": spread(reuse), "ttft_p50": spread(p50), "ttft_p95": spread(p95)}


def per_system(runs: list[dict[str, Any]], system: str) -> dict[str, dict[str, float]]:
    keys = (
        "prompt_tokens",
        "reused_tokens",
        "reused_tokens_probes",
        "requests_with_reuse",
        "ttft_p50_ms",
        "ttft_p95_ms",
        "cross_tenant_hits",
        "cross_tenant_hits_probes",
        "cross_tenant_hits_raw",
        "cross_tenant_tokens",
        "errors",
        "wall_s",
        "header_mismatches",
        "requests",
    )
    mine = [r["summary"] for r in runs if r["system"] == system]
    return {k: spread([float(s[k]) for s in mine]) for k in keys}


def throughput_ratios(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "ratio": spread([_ratio(p["runner"]["rps"], p["direct"]["rps"]) for p in pairs]),
        "direct_rps": spread([p["direct"]["rps"] for p in pairs]),
        "runner_rps": spread([p["runner"]["rps"] for p in pairs]),
        "direct_p50_ms": spread([p["direct"]["p50_ms"] for p in pairs]),
        "runner_p50_ms": spread([p["runner"]["p50_ms"] for p in pairs]),
        "errors": sum(p["direct"]["errors"] + p["runner"]["errors"] for p in pairs),
    }


def _f(s: dict[str, float], digits: int = 2) -> str:
    fmt = f"{{:.{digits}f}}"
    return f"{fmt.format(s['median'])} [{fmt.format(s['min'])}, {fmt.format(s['max'])}]"


def _n(s: dict[str, float]) -> str:
    if s["min"] == s["max"]:
        return f"{s['median']:.0f}"
    return f"{s['median']:.0f} [{s['min']:.0f}, {s['max']:.0f}]"


def _mark(ok: bool) -> str:
    return "**pass**" if ok else "**FAIL**"


def markdown(result: dict[str, Any]) -> str:
    cfg, m = result["config"], result["machine"]
    runs = result["runs"]
    lines = [
        f"Run {result['started']}, code: the work tree at {m['git_head']}"
        + (" (uncommitted changes in runner/ or adapters/)" if m["uncommitted"] else "")
        + ". Command:",
        "",
        f"    {result['command']}",
        "",
        f"Machine: {m['nproc']} cores ({m['cpu']}), shared with other jobs; load average "
        f"before {result['loadavg_before']}, after {result['loadavg_after']}. Engine: "
        f"llama-server {result['engine']['version']} (CPU), Gemma 3 270M Q4_K_M, "
        f"--parallel {cfg['parallel']}, --ctx-size {cfg['parallel'] * cfg['ctx_per_slot']}"
        + (
            f" (the runner's engine in the trace runs: --parallel {cfg['runner_parallel']}, "
            f"--ctx-size {cfg['runner_parallel'] * cfg['ctx_per_slot']}, a diagnostic)"
            if cfg.get("runner_parallel", cfg["parallel"]) != cfg["parallel"]
            else ""
        )
        + (f", {' '.join(cfg['engine_args'])} on both sides" if cfg["engine_args"] else "")
        + ".",
        f"Trace: {cfg['tenants']} tenants x {cfg['sessions_per_tenant']} sessions x "
        f"{cfg['turns']} turns (system prompts ~{result['trace']['system_tokens']} tokens, "
        f"{cfg['open_sessions']} conversations open at a time, {cfg['concurrency']} requests "
        f"in flight), plus {result['trace']['probes']} probes (a tenant sends another "
        f"tenant's system prompt); {result['trace']['requests']} requests, max_tokens 8, "
        f"temperature 0, streamed. {cfg['reps']} repetitions, runner and direct interleaved "
        "(order alternating), each run on freshly started engines; figures are medians over "
        "repetitions, [min, max] in brackets.",
        "",
        "| system | prompt tokens reused (chat turns) | of prompt tokens | TTFT p50 (ms) | "
        "TTFT p95 (ms) | cross-tenant hits: all / probes | cross-tenant tokens | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for system, label in LABELS.items():
        if system not in cfg["systems"]:
            continue
        s = per_system(runs, system)
        share = s["reused_tokens"]["median"] / max(1.0, s["prompt_tokens"]["median"])
        lines.append(
            f"| {label} | {_n(s['reused_tokens'])} | {share:.0%} | {_n(s['ttft_p50_ms'])} | "
            f"{_n(s['ttft_p95_ms'])} | {_n(s['cross_tenant_hits'])} / "
            f"{_n(s['cross_tenant_hits_probes'])} | {_n(s['cross_tenant_tokens'])} | "
            f"{_n(s['errors'])} |"
        )
    ratios = result["ratios"]
    runner = per_system(runs, "runner")
    lines += [
        "",
        "| runner ÷ direct (per pair) | median [min, max] | target |",
        "|---|---:|---|",
        f"| cross-tenant hits through the runner | {_n(runner['cross_tenant_hits'])} | 0 "
        f"{_mark(runner['cross_tenant_hits']['max'] == 0)} |",
        f"| prompt tokens reused | {_f(ratios['reuse'])} | ≥ {TARGETS['reuse']} "
        f"{_mark(ratios['reuse']['median'] >= TARGETS['reuse'])} |",
        f"| TTFT p50 | {_f(ratios['ttft_p50'])} | ≤ {TARGETS['ttft_p50']} "
        f"{_mark(ratios['ttft_p50']['median'] <= TARGETS['ttft_p50'])} |",
        f"| TTFT p95 | {_f(ratios['ttft_p95'])} | - |",
    ]
    noram = result.get("ratios_vs_noram")
    if noram:
        lines.append(
            f"| (diagnostic) runner ÷ direct --cache-ram 0: reused / TTFT p50 | "
            f"{_f(noram['reuse'])} / {_f(noram['ttft_p50'])} | - |"
        )
    tp = result.get("throughput")
    if tp:
        t = tp["summary"]
        lines += [
            f"| throughput, {tp['clients']} clients, short prompts | {_f(t['ratio'], 3)} | "
            f"≥ {TARGETS['throughput']} {_mark(t['ratio']['median'] >= TARGETS['throughput'])} |",
            "",
            f"Throughput: {tp['pairs']} interleaved pairs of {tp['duration_s']:g} s closed-loop "
            f"runs, {tp['clients']} clients ({tp['tenants']} tenants), JSON, max_tokens 8: "
            f"direct {_f(t['direct_rps'])} req/s, runner {_f(t['runner_rps'])} req/s; "
            f"latency p50 direct {_n(t['direct_p50_ms'])} ms, runner {_n(t['runner_p50_ms'])} "
            f"ms; errors {t['errors']}.",
        ]
    lines += [
        "",
        "Cross-tenant hit: the engine reported reusing more prompt tokens than the longest "
        "prefix the prompt shares with an earlier request of the same tenant (or with the "
        f"chat template's opening, {result['trace']['public_len']} tokens, that every prompt "
        "starts with); tokens from the engine's /tokenize "
        f"({result['trace']['token_count_mismatches']} prompt lengths differed from the "
        "engine's prompt_tokens). Counting the template's opening as a hit too: direct "
        f"{_n(per_system(runs, 'direct')['cross_tenant_hits_raw'])}, runner "
        f"{_n(runner['cross_tenant_hits_raw'])}. The runner's X-Cache-Tokens-Reused header "
        f"disagreed with the engine's cache_n on {_n(runner['header_mismatches'])} requests "
        "per run.",
    ]
    return "\n".join(lines)
