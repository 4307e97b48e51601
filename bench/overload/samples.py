"""What the load generator records per request, and the figures it derives from that."""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.overload.loadgen import Pool


@dataclass(slots=True)
class Sample:
    """One request: times (perf_counter seconds) and what came back."""

    tenant: str
    scheduled: float
    sent: float = 0.0
    done: float = 0.0
    status: int = 0  # 0: no answer (error or timeout)
    code: str = ""  # the error envelope's `code` for non-200 answers
    retry_after: str = ""
    error: str = ""


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (0 for an empty list)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]


def latency_ms(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1e3 for v in values_s]
    return {
        "n": len(ms),
        "p50": round(pct(ms, 50), 3),
        "p90": round(pct(ms, 90), 3),
        "p99": round(pct(ms, 99), 3),
        "p999": round(pct(ms, 99.9), 3),
        "max": round(max(ms, default=0.0), 3),
    }


def summarize(
    samples: list[Sample], pool: Pool, args: argparse.Namespace, cpu_s: float
) -> dict[str, object]:
    """Figures over the window [warmup, duration] (requests sent in it, answers done in it)."""
    w0, w1 = args.warmup, args.duration
    window = w1 - w0
    sent = [s for s in samples if s.sent]
    measured = [s for s in sent if w0 <= s.sent < w1]
    by_class: dict[str, list[float]] = {}
    for s in measured:
        if s.status:
            key = str(s.status) if s.status == 200 else f"{s.status} {s.code}"
            by_class.setdefault(key, []).append(s.done - s.sent)
    ok_done = sum(1 for s in sent if s.status == 200 and w0 <= s.done < w1)
    lags = [(s.sent - s.scheduled) * 1e3 for s in sent]
    retry: dict[str, Counter[str]] = {}
    for s in measured:
        if s.retry_after:
            retry.setdefault(str(s.status), Counter())[s.retry_after] += 1
    span = max((s.sent for s in sent), default=0.0) - min((s.sent for s in sent), default=0.0)
    return {
        "mode": args.mode,
        "target_rate": args.rate if args.mode == "open" else None,
        "concurrency": args.concurrency if args.mode == "closed" else None,
        "arrivals": args.arrivals if args.mode == "open" else None,
        "duration_s": args.duration,
        "warmup_s": w0,
        "tenants": args.tenants.split(","),
        "requests": len(samples),
        "sent": len(sent),
        "achieved_send_rate": round((len(sent) - 1) / span, 2) if span > 0 else 0.0,
        "send_lag_ms": {
            "p50": round(pct(lags, 50), 3),
            "p99": round(pct(lags, 99), 3),
            "max": round(max(lags, default=0.0), 3),
        },
        "connections_opened": pool.opened,
        "stale_retries": pool.stale,
        "client_cpu_s": round(cpu_s, 3),
        "counts": dict(Counter(k for k, v in by_class.items() for _ in v)),
        "counts_by_tenant": _by_tenant(measured),
        "errors": dict(Counter(s.error for s in measured if s.error)),
        "latency_ms": {k: latency_ms(v) for k, v in sorted(by_class.items())},
        "ok_per_s": round(ok_done / window, 2) if window > 0 else 0.0,
        "retry_after": {
            k: dict(sorted(c.items(), key=lambda kv: int(kv[0]))) for k, c in retry.items()
        },
    }


def _by_tenant(samples: list[Sample]) -> dict[str, dict[str, int]]:
    out: dict[str, Counter[str]] = {}
    for s in samples:
        out.setdefault(s.tenant, Counter())[str(s.status or s.error)] += 1
    return {t: dict(c) for t, c in sorted(out.items())}
