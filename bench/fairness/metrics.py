"""Fairness and throughput figures from a replay's `Outcome`.

Service is weighted tokens (input x1 + output x2) actually processed by the
simulated engine, accrued linearly over each request's service time, as the
VTC artifact's plots do (`service * overlap / (end - start)`).
"""

from __future__ import annotations

import math

from bench.fairness.sim import Outcome
from bench.fairness.workloads import Arrival
from tenants.fairness import service_cost

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


def _backlog_states(outcome: Outcome, lo: float, hi: float) -> list[frozenset[str]]:
    before = [b for at, b in outcome.backlog if at <= lo]
    inside = [b for at, b in outcome.backlog if lo < at <= hi]
    return ([before[-1]] if before else [frozenset()]) + inside


def windowed_diff(outcome: Outcome, tenants: set[str]) -> dict[str, float]:
    """The paper's metric: per-window service rate, how far a backlogged tenant falls behind.

    60 s windows every 10 s. In each window, the tenants that had requests waiting the
    whole time (backlogged) are owed at least as much as any tenant got: the window's
    difference is the largest service rate of any tenant minus the smallest of the
    backlogged ones. With every tenant backlogged that is max minus min across tenants
    (the paper's figure for two backlogged clients); a tenant that asked for less than
    its share and got it all is not backlogged and owed nothing more. Only windows with
    at least one backlogged tenant count. Returns max and mean in weighted tokens per
    second, and how many windows counted.
    """
    diffs: list[float] = []
    x = WINDOW_S / 2
    while x + WINDOW_S / 2 <= outcome.duration_s:
        lo, hi = x - WINDOW_S / 2, x + WINDOW_S / 2
        backlogged = frozenset(tenants).intersection(*_backlog_states(outcome, lo, hi))
        if backlogged:
            rates = {t: _service(outcome, t, lo, hi) / WINDOW_S for t in tenants}
            diffs.append(max(rates.values()) - min(rates[t] for t in backlogged))
        x += STEP_S
    if not diffs:
        return {"max": math.nan, "mean": math.nan, "windows": 0}
    return {"max": max(diffs), "mean": sum(diffs) / len(diffs), "windows": len(diffs)}


def demand_diff(outcome: Outcome, tenants: set[str], arrivals: list[Arrival]) -> dict[str, float]:
    """The artifact's table metric (`fair_bench/plot/plot_6.2_work_diff.py`,
    `get_service_diff_over_time`): per window, each tenant's shortfall
    min(max service rate - its rate, its requested rate - its rate), max over tenants.

    The requested rate is the weighted tokens of the requests that arrived in the
    window per second, so a tenant that got all it asked for is owed nothing even if
    others got more. Same windows as `windowed_diff`, all of them counted, as the
    artifact does; `max_after_first` leaves out the first window (the start-up, when
    slots are granted in arrival order before anyone is backlogged).
    """
    diffs: list[float] = []
    x = WINDOW_S / 2
    while x + WINDOW_S / 2 <= outcome.duration_s:
        lo, hi = x - WINDOW_S / 2, x + WINDOW_S / 2
        rates = {t: _service(outcome, t, lo, hi) / WINDOW_S for t in tenants}
        asked = dict.fromkeys(tenants, 0.0)
        for a in arrivals:
            if lo <= a.at <= hi and a.tenant in asked:
                asked[a.tenant] += service_cost(a.input_tokens, a.output_tokens) / WINDOW_S
        top = max(rates.values())
        diffs.append(max(min(top - rates[t], asked[t] - rates[t]) for t in tenants))
        x += STEP_S
    if not diffs:
        return {"max": math.nan, "mean": math.nan, "windows": 0, "max_after_first": math.nan}
    return {
        "max": max(diffs),
        "mean": sum(diffs) / len(diffs),
        "windows": len(diffs),
        "max_after_first": max(diffs[1:], default=math.nan),
    }


def interval_diff(outcome: Outcome, tenants: set[str]) -> float:
    """The theorem's quantity: max over tenants f and g, and intervals [t1, t2] in which f
    stays backlogged, of W_g(t1, t2) - W_f(t1, t2), in weighted tokens.

    With two tenants backlogged together that is max |W_a - W_b| over their joint
    backlog. With D(t) = W_g(0, t) - W_f(0, t) piecewise linear between events, it is
    max over t1 <= t2 of D(t2) - D(t1) within each of f's backlog periods, sampled at
    every event.
    """
    names = sorted(tenants)
    served = sorted(outcome.served, key=lambda s: s.start)
    done = dict.fromkeys(names, 0.0)
    active: list[int] = []
    nxt = 0
    # per ordered pair (f, g): the smallest D seen in f's current backlog period
    low: dict[tuple[str, str], float | None] = {(f, g): None for f in names for g in names}
    best = 0.0
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
        for f in names:
            for g in names:
                if f == g:
                    continue
                if f not in backlog:
                    low[f, g] = None
                    continue
                d = w[g] - w[f]
                lo_d = low[f, g]
                lo_d = d if lo_d is None else min(lo_d, d)
                low[f, g] = lo_d
                best = max(best, d - lo_d)
    return best


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (`q` in 0..1)."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
