"""Fairness and throughput figures from a replay's `Outcome`.

Service is weighted tokens (input x1 + output x2) actually processed by the
simulated engine, accrued linearly over each request's service time, as the
VTC artifact's plots do (`service * overlap / (end - start)`).
"""

from __future__ import annotations

import math

from bench.fairness.sim import Outcome

WINDOW_S = 60.0
STEP_S = 10.0


def _service(outcome: Outcome, tenant: str, lo: float, hi: float) -> float:
    total = 0.0
    for s in outcome.served:
        if s.tenant == tenant and s.end > lo and s.start < hi:
            total += s.cost * (min(hi, s.end) - max(lo, s.start)) / (s.end - s.start)
    return total


def throughput(outcome: Outcome) -> float:
    """Weighted tokens per second processed within the run."""
    done = sum(
        s.cost * (min(outcome.duration_s, s.end) - s.start) / (s.end - s.start)
        for s in outcome.served
        if s.start < outcome.duration_s
    )
    return done / outcome.duration_s


def _backlogged_throughout(outcome: Outcome, tenants: set[str], lo: float, hi: float) -> bool:
    before = [b for at, b in outcome.backlog if at <= lo]
    inside = [b for at, b in outcome.backlog if lo < at <= hi]
    states = ([before[-1]] if before else [frozenset()]) + inside
    return all(tenants <= state for state in states)


def windowed_diff(outcome: Outcome, tenants: set[str]) -> dict[str, float]:
    """The paper's metric: per-window service rate, max minus min across tenants.

    60 s windows every 10 s; only windows in which every tenant had requests
    waiting the whole time count (the backlogged clients). Returns max and
    mean in weighted tokens per second, and how many windows counted.
    """
    diffs: list[float] = []
    x = WINDOW_S / 2
    while x + WINDOW_S / 2 <= outcome.duration_s:
        lo, hi = x - WINDOW_S / 2, x + WINDOW_S / 2
        if _backlogged_throughout(outcome, tenants, lo, hi):
            rates = [_service(outcome, t, lo, hi) / WINDOW_S for t in tenants]
            diffs.append(max(rates) - min(rates))
        x += STEP_S
    if not diffs:
        return {"max": math.nan, "mean": math.nan, "windows": 0}
    return {"max": max(diffs), "mean": sum(diffs) / len(diffs), "windows": len(diffs)}


def interval_diff(outcome: Outcome, tenants: tuple[str, str]) -> float:
    """The theorem's quantity: max over intervals [t1, t2] in which both tenants stay
    backlogged of |W_a(t1, t2) - W_b(t1, t2)|, in weighted tokens.

    With D(t) = W_a(0, t) - W_b(0, t) piecewise linear between events, that is
    max(D) - min(D) over each joint-backlog period, sampled at every event.
    """
    a, b = tenants
    served = sorted(outcome.served, key=lambda s: s.start)
    done = {a: 0.0, b: 0.0}
    active: list[int] = []
    nxt = 0
    best = 0.0
    lo_d = hi_d = None
    for at, backlog in outcome.backlog:
        while nxt < len(served) and served[nxt].start <= at:
            active.append(nxt)
            nxt += 1
        still: list[int] = []
        for i in active:
            s = served[i]
            if s.end <= at:
                done[s.tenant] = done.get(s.tenant, 0.0) + s.cost
            else:
                still.append(i)
        active = still
        w = dict(done)
        for i in active:
            s = served[i]
            w[s.tenant] = w.get(s.tenant, 0.0) + s.cost * (at - s.start) / (s.end - s.start)
        d = w[a] - w[b]
        if {a, b} <= backlog:
            lo_d = d if lo_d is None else min(lo_d, d)
            hi_d = d if hi_d is None else max(hi_d, d)
            best = max(best, hi_d - lo_d)
        else:
            lo_d = hi_d = None
    return best


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (`q` in 0..1)."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
