"""Figures of the overload bench: per-repetition values, medians, verdicts, Markdown."""

from __future__ import annotations

import statistics
from typing import Any

REFUSALS = ("429 rate_limit_exceeded", "503 queue_full")
TARGET_P99_MS = 2.0
TARGET_GOODPUT = 0.95
SCENARIOS = {
    "queue": "(a) queue backpressure: depth 16, no rate limit",
    "ratelimit": "(b) rate limit: tenants together ~1.2x saturation",
}


def _ok_per_s(run: dict[str, Any]) -> float:
    return float(run["main"]["ok_per_s"] + run["probe"]["ok_per_s"])


def _lat(side: dict[str, Any], cls: str, q: str) -> float | None:
    lat = side["latency_ms"].get(cls)
    return None if lat is None or lat["n"] == 0 else float(lat[q])


def one_line(rep: int, name: str, sat: float, run: dict[str, Any]) -> str:
    m, p = run["main"], run["probe"]
    parts = [
        f"rep {rep + 1} {name:9} sat {sat:.1f}/s offered {run['offered_rate']:.1f}/s",
        f"sent {m['achieved_send_rate']:.1f}+{p['achieved_send_rate']:.1f}/s",
        f"goodput {_ok_per_s(run) / sat:.3f}x",
    ]
    for cls in REFUSALS:
        if cls in m["latency_ms"]:
            lat = m["latency_ms"][cls]
            parts.append(
                f"{cls.split()[0]} n={lat['n']} p50/p99 {lat['p50']:.2f}/{lat['p99']:.2f} ms"
            )
    for cls in REFUSALS:
        if cls in p["latency_ms"]:
            lat = p["latency_ms"][cls]
            parts.append(f"probe {cls.split()[0]} p99 {lat['p99']:.2f} ms")
    floor = run["null_probe"]["latency_ms"].get("429 rate_limit_exceeded")
    if floor:
        parts.append(f"null p99 {floor['p99']:.2f} ms")
    u = run["usage"]
    parts.append(
        "cpu/runq-wait per slice: "
        + ", ".join(
            f"{k} {v['cpu_s']:.2f}s/{v['runq_wait_ms_per_slice']:.2f}ms" for k, v in u.items()
        )
    )
    return " | ".join(parts)


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Medians over repetitions (with min and max) and the verdicts against the targets."""
    out: dict[str, Any] = {}
    for name in SCENARIOS:
        runs = [(row["saturation"], row[name]) for row in result["reps"]]
        if not runs:
            continue
        s: dict[str, Any] = {
            "goodput_ratio": _spread([_ok_per_s(r) / sat for sat, r in runs]),
            "offered_ratio": _spread([r["offered_rate"] / sat for sat, r in runs]),
            "send_rate_ratio": _spread(
                [
                    (r["main"]["achieved_send_rate"] + r["probe"]["achieved_send_rate"])
                    / r["offered_rate"]
                    for _, r in runs
                ]
            ),
            "send_lag_p99_ms": _spread([r["main"]["send_lag_ms"]["p99"] for _, r in runs]),
            "null_429_p50": _spread(
                [r["null_probe"]["latency_ms"]["429 rate_limit_exceeded"]["p50"] for _, r in runs]
            ),
            "null_429_p99": _spread(
                [r["null_probe"]["latency_ms"]["429 rate_limit_exceeded"]["p99"] for _, r in runs]
            ),
            "runner_cpu_share": _spread(
                [r["usage"]["runner"]["cpu_s"] / r["main"]["duration_s"] for _, r in runs]
            ),
            "runner_runq_wait_ms": _spread(
                [r["usage"]["runner"]["runq_wait_ms_per_slice"] for _, r in runs]
            ),
            "counts": _sum_counts([r["main"]["counts"] for _, r in runs]),
            "errors": _sum_counts([r["main"]["errors"] for _, r in runs]),
            "retry_after": _retry_values([r["main"] for _, r in runs]),
        }
        verdicts = [s["goodput_ratio"]["median"] >= TARGET_GOODPUT]
        for cls in REFUSALS:
            for side in ("main", "probe"):
                qs = {
                    q: [v for _, r in runs if (v := _lat(r[side], cls, q)) is not None]
                    for q in ("p50", "p99", "p999", "max")
                }
                if qs["p99"]:
                    s[f"{side} {cls}"] = {q: _spread(v) for q, v in qs.items()}
                    if side == "main":
                        verdicts.append(statistics.median(qs["p99"]) <= TARGET_P99_MS)
        for status in ("429", "503"):
            inside = [r["server"][status] for _, r in runs if status in r.get("server", {})]
            if inside:
                s[f"server {status}"] = {
                    q: _spread([x[q] for x in inside]) for q in ("p50", "p99", "p999", "max")
                }
        s["pass"] = all(verdicts)
        out[name] = s
    return out


def _sum_counts(counts: list[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    return dict(sorted(total.items()))


def _retry_values(sides: list[dict[str, Any]]) -> dict[str, list[int]]:
    seen: dict[str, set[int]] = {}
    for side in sides:
        for status, values in side["retry_after"].items():
            seen.setdefault(status, set()).update(int(v) for v in values)
    return {k: sorted(v) for k, v in sorted(seen.items())}


def _fmt(s: dict[str, Any] | None, key: str) -> str:
    if s is None:
        return "-"
    v = s[key]
    return f"{v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})"


def markdown(result: dict[str, Any]) -> str:
    summary = result["summary"]
    sat = result["saturation"]
    idle = result["idle_429"]["latency_ms"].get("429 rate_limit_exceeded", {})
    reps = len(result["reps"])
    lines = [
        f"Run {result['started']}, {result['tested_code']} (`python -m "
        f"{result.get('runner_launch', 'runner')}`), {result['machine']['nproc']} cores "
        f"({result['machine']['cpu']}), Python {result['machine']['python']}; load average "
        f"before {result['loadavg_before']}, after {result['loadavg_after']}.",
        "",
        f"    {result['command']}",
        "",
        f"Saturation (closed loop, 200s/s): direct to the engine, 4 clients "
        f"{sat['direct_c4']['ok_per_s']}; through the runner, 4 clients "
        f"{sat['runner_c4']['ok_per_s']}, 8 clients {sat['runner_c8']['ok_per_s']}; "
        f"per repetition (8 clients): {', '.join(str(r['saturation']) for r in result['reps'])}. "
        f"Idle 429 floor (probe alone, 20 req/s): p50 {idle.get('p50', '-')} ms, "
        f"p99 {idle.get('p99', '-')} ms.",
        "",
        f"Medians over {reps} repetition(s), (min-max) in brackets; latencies in ms, timed by "
        "the client from writing the request to the end of the answer.",
        "",
        "| figure | " + " | ".join(SCENARIOS[n] for n in summary) + " |",
        "|---|" + "---:|" * len(summary),
    ]
    rows: list[tuple[str, list[str]]] = [
        ("offered ÷ saturation", [_fmt(s, "offered_ratio") for s in summary.values()]),
        ("sent ÷ offered (load generator)", [_fmt(s, "send_rate_ratio") for s in summary.values()]),
        ("send lag p99 (ms)", [_fmt(s, "send_lag_p99_ms") for s in summary.values()]),
        ("**goodput ÷ saturation**", [_fmt(s, "goodput_ratio") for s in summary.values()]),
    ]
    for cls in REFUSALS:
        short = cls.split()[0]
        for q in ("p50", "p99", "p999", "max"):
            name = {"p999": "p99.9"}.get(q, q)
            label = f"**{short} {name}**" if q == "p99" else f"{short} {name}"
            rows.append((label, [_fmt(s.get(f"main {cls}"), q) for s in summary.values()]))
        rows.append(
            (
                f"{short} p99, probe client",
                [_fmt(s.get(f"probe {cls}"), "p99") for s in summary.values()],
            )
        )
    for status in ("429", "503"):
        for q in ("p50", "p99", "max"):
            rows.append(
                (
                    f"{status} {q} inside the runner (data path call to return)",
                    [_fmt(s.get(f"server {status}"), q) for s in summary.values()],
                )
            )
    rows = [r for r in rows if any(v != "-" for v in r[1])]
    rows += [
        (
            "429 p50 of a null server (fixed 429, same uvicorn setup), probe client",
            [_fmt(s, "null_429_p50") for s in summary.values()],
        ),
        (
            "429 p99 of a null server (fixed 429, same uvicorn setup), probe client",
            [_fmt(s, "null_429_p99") for s in summary.values()],
        ),
        ("runner CPU (share of one core)", [_fmt(s, "runner_cpu_share") for s in summary.values()]),
        (
            "runner main thread: mean run-queue wait per time slice (ms)",
            [_fmt(s, "runner_runq_wait_ms") for s in summary.values()],
        ),
        ("answers (all reps)", [_counts(s["counts"]) for s in summary.values()]),
        ("Retry-After values (s)", [_retry(s["retry_after"]) for s in summary.values()]),
        ("client errors", [str(sum(s["errors"].values())) for s in summary.values()]),
        ("**verdict**", ["pass" if s["pass"] else "**fail**" for s in summary.values()]),
    ]
    lines += [f"| {label} | " + " | ".join(vals) + " |" for label, vals in rows]
    return "\n".join(lines)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in counts.items())


def _retry(values: dict[str, list[int]]) -> str:
    return "; ".join(f"{k}: {v}" for k, v in values.items())
