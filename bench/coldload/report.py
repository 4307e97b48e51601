"""The cold-load figures: per-pair ratios, the eta of each load, and the Markdown table."""

from __future__ import annotations

import statistics
from typing import Any

MODEL = "gemma-3-270m"
QUIET_PAIR = 0.3
"""A pair is quiet when other jobs used fewer cores than this during both of its loads."""


def spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(pairs: list[dict[str, Any]], via: str, quiet_below: float) -> dict[str, Any]:
    """Per-pair ratios, then median and spread; for the api, each load's eta vs actual."""
    out: dict[str, Any] = {
        "ratio": spread([p["ratio"] for p in pairs]),
        "runner_ms": spread([p["runner"]["ms"] for p in pairs]),
        "by_hand_ms": spread([p["by_hand"]["ms"] for p in pairs]),
        "engine_cpu_ratio": spread(
            [p["runner"]["engine_cpu_s"] / p["by_hand"]["engine_cpu_s"] for p in pairs]
        ),
        "by_hand_engine_cpu_s": spread([p["by_hand"]["engine_cpu_s"] for p in pairs]),
        "other_cores": spread([p[k]["other_cores"] for p in pairs for k in ("runner", "by_hand")]),
        "quiet_reached": sum(p["quiet"]["others_cores"] < quiet_below for p in pairs),
    }
    quiet = [
        p["ratio"]
        for p in pairs
        if max(p["runner"]["other_cores"], p["by_hand"]["other_cores"]) < QUIET_PAIR
    ]
    out["quiet_pairs"] = len(quiet)
    out["quiet_ratio"] = spread(quiet)
    outside = [
        p
        for p in pairs
        if p["runner"].get("outside_ms") is not None and p["by_hand"].get("outside_ms") is not None
    ]
    out["outside_pairs"] = len(outside)
    out["runner_outside_ms"] = spread([p["runner"]["outside_ms"] for p in outside])
    out["by_hand_outside_ms"] = spread([p["by_hand"]["outside_ms"] for p in outside])
    if via == "api":
        out["runner_cpu_s"] = spread([p["runner"]["runner_cpu_s"] for p in pairs])
        out["pool_ready_ratio"] = spread(
            [p["runner"]["pool_ready_ms"] / p["by_hand"]["ms"] for p in pairs]
        )
        out["client_wall_ratio"] = spread(
            [p["runner"]["client_wall_ms"] / p["by_hand"]["ms"] for p in pairs]
        )
    return out


def eta_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Every api load in the order the runner made them: its first eta vs its load time."""
    loads = [result["warm"]["runner"]] + [p["runner"] for p in result["pairs"]]
    rows = []
    for n, load in enumerate(loads):
        eta = load.get("eta_s")
        actual_s = load["ms"] / 1e3
        error = (eta - actual_s) / actual_s if isinstance(eta, int | float) else None
        rows.append({"load": n, "eta_s": eta, "actual_s": actual_s, "error": error})
    return rows


def _f(s: dict[str, float], digits: int = 3) -> str:
    fmt = f"{{:.{digits}f}}"
    return f"{fmt.format(s['median'])} [{fmt.format(s['min'])}, {fmt.format(s['max'])}]"


def markdown(result: dict[str, Any]) -> str:
    m, s, via = result["machine"], result["summary"], result["via"]
    how = (
        "governed POST /v1/models/load, task polled until completed; figure: the task's loadTimeMs"
        if via == "api"
        else "a runner per load with preload: true; figure: the pool's 'ready in N ms' log line"
    )
    lines = [
        f"Run {result['started']}, code: the work tree at {m['git_head']}. Command:",
        "",
        f"    {result['command']}",
        "",
        f"Machine: {m['nproc']} cores ({m['cpu']}), shared with other jobs; load average "
        f"before {result['loadavg_before']}, after {result['loadavg_after']}. Model: the "
        f"default models.yaml entry {MODEL} (Gemma 3 270M Q4_K_M, llama-server, CPU). "
        f"Runner: {how}. By hand: the same llama-server argv (`{' '.join(result['flags'])}`), "
        f"spawn to the first /health 200, polled every {result['poll_ms']:g} ms. "
        f"{len(result['pairs'])} interleaved pairs after one untimed load of each; "
        "median [min, max] over pairs. Before each pair the bench waited up to "
        f"{result['quiet_wait_s']:g} s for other jobs to use < {result['quiet_below']:g} "
        f"cores: reached for {s['quiet_reached']} of {len(result['pairs'])} pairs.",
        "",
        "| figure | median [min, max] | target |",
        "|---|---:|---|",
        f"| by hand: spawn to healthy (ms) | {_f(s['by_hand_ms'], 0)} | - |",
        f"| runner: load time (ms) | {_f(s['runner_ms'], 0)} | - |",
        f"| runner ÷ by hand (per pair) | {_f(s['ratio'])} | ≤ 1.05 "
        f"{'**pass**' if s['ratio']['median'] <= 1.05 else '**FAIL**'} |",
        f"| engine CPU seconds to healthy, by hand | {_f(s['by_hand_engine_cpu_s'], 2)} | - |",
        f"| engine CPU seconds, runner ÷ by hand | {_f(s['engine_cpu_ratio'])} | - |",
        f"| cores used by other jobs during the loads | {_f(s['other_cores'], 2)} | - |",
        f"| runner ÷ by hand, quiet pairs only ({s['quiet_pairs']}: other jobs < "
        f"{QUIET_PAIR:g} cores during both loads) | {_f(s['quiet_ratio'])} | - |",
    ]
    if s.get("outside_pairs"):
        lines += [
            f"| outside the engine's own start (ms; load figure minus the engine's "
            f"'model loaded' timestamp), by hand (includes its {result['poll_ms']:g} ms "
            f"polls) | {_f(s['by_hand_outside_ms'], 1)} | - |",
            f"| outside the engine's own start (ms), runner | "
            f"{_f(s['runner_outside_ms'], 1)} | - |",
        ]
    if via == "api":
        lines += [
            f"| pool's own spawn-to-healthy ÷ by hand | {_f(s['pool_ready_ratio'])} | - |",
            f"| runner process CPU seconds during a load | {_f(s['runner_cpu_s'], 3)} | - |",
            f"| client's POST-to-completed wall ÷ by hand (task polled every "
            f"{result['task_poll_ms']:g} ms) | {_f(s['client_wall_ratio'])} | - |",
        ]
        rows = result["eta"]
        lines += [
            "",
            "Load-task eta (the 202 answer's, whole seconds) vs the load's loadTimeMs, in the "
            "order of the runner's loads (load 0 = the untimed warm-up; the estimator learns "
            "from each finished load):",
            "",
            "| load | eta (s) | actual (s) | error | within ±25% |",
            "|---:|---:|---:|---:|---|",
        ]
        for r in rows:
            err = r["error"]
            lines.append(
                f"| {r['load']} | {r['eta_s']} | {r['actual_s']:.2f} | "
                + (
                    f"{err:+.0%} | {'yes' if abs(err) <= 0.25 else 'no'} |"
                    if err is not None
                    else "- | - |"
                )
            )
    return "\n".join(lines)
