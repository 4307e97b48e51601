"""Synthetic workloads after the VTC paper's artifact (Ying1123/VTC-artifact, fair_bench).

- `overload`: two clients, deterministic arrivals at 1.5 and 3 req/s (random
  phase), every request 256 input + 256 output tokens, 6 minutes
  (`generate_requests_uniform` with `req_rate=[1.5, 3]`).
- `poisson_short_long`: one Poisson stream at 9.5 req/s, each request going to
  client 0 with probability 8/9.5 (64 + 64 tokens: the 256 range divided by 4)
  or to client 1 (256 + 256 tokens), 10 minutes
  (`generate_requests_poisson_short_long` with `req_rate=[8, 1.5]`, cv=1).

Generated with Python's `random` (seeded), not numpy, so the exact arrival
times differ from the artifact's; the rates, sizes, durations and shapes are
the paper's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Arrival:
    at: float
    tenant: str
    input_tokens: int
    output_tokens: int
    priority: str = "normal"


def overload(seed: int = 42, duration_s: float = 360.0) -> list[Arrival]:
    rng = random.Random(seed)
    arrivals: list[Arrival] = []
    for i, rate in enumerate((1.5, 3.0)):
        t = rng.random() / rate
        for _ in range(int(rate * duration_s)):
            t += 1 / rate
            arrivals.append(Arrival(t, f"client{i}", 256, 256))
    return sorted(arrivals, key=lambda a: a.at)


def poisson_short_long(seed: int = 42, duration_s: float = 600.0) -> list[Arrival]:
    rng = random.Random(seed)
    rates = (8.0, 1.5)
    total = sum(rates)
    arrivals: list[Arrival] = []
    t = 0.0
    for _ in range(int(total * duration_s)):
        t += rng.expovariate(total)
        if rng.random() < rates[0] / total:
            arrivals.append(Arrival(t, "client0", 64, 64))
        else:
            arrivals.append(Arrival(t, "client1", 256, 256))
    return arrivals


def poisson_mix(
    rate: float, duration_s: float, tenants: int, seed: int = 7, tokens: int = 256
) -> list[Arrival]:
    """Poisson arrivals at `rate` req/s spread evenly over `tenants`, for the overload test."""
    rng = random.Random(seed)
    arrivals: list[Arrival] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return arrivals
        tenant = f"tenant{rng.randrange(tenants)}"
        arrivals.append(Arrival(t, tenant, tokens, tokens))
