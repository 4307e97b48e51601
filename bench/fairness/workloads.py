"""Synthetic workloads after the VTC paper's artifact (Ying1123/VTC-artifact, fair_bench).

The four workloads of the paper's synthetic section, as `fair_bench/exp_suite.py`
(`paper_suite`) configures them and `fair_bench/trace.py` generates them:

- `overload`: two clients, deterministic arrivals at 1.5 and 3 req/s (random
  phase), every request 256 input + 256 output tokens, 6 minutes
  (`generate_requests_uniform` with `req_rate=[1.5, 3]`).
- `proportional`: three clients, deterministic arrivals at 0.25, 0.5 and 1.5
  req/s (random phase), 256 + 256 tokens, 10 minutes (`generate_requests_uniform`
  with `req_rate=[0.25, 0.5, 1.5]`).
- on/off: two clients with deterministic arrivals, 256 + 256 tokens, 10 minutes;
  client 0 sends only in the even minutes (`on_off=60`: a request whose time `t`
  has `int(t // 60)` odd is dropped), client 1 all the time
  (`generate_requests_uniform` with `on_off=60`). The artifact has two of them:
  `on_off_less` (`req_rate=[0.5, 2]`: client 0 asks for less than its share) and
  `on_off_overload` (`req_rate=[2, 3]`: both ask for more); both are replayed.
- `poisson_short_long`: one Poisson stream at 9.5 req/s, each request going to
  client 0 with probability 8/9.5 (64 + 64 tokens: the 256 range divided by 4)
  or to client 1 (256 + 256 tokens), 10 minutes
  (`generate_requests_poisson_short_long` with `req_rate=[8, 1.5]`, cv=1).

The artifact's token ranges are `[256, 257)` (numpy `randint`), so every length
is exactly 256. Generated with Python's `random` (seeded), not numpy, so the
exact arrival times (the random phases, the Poisson draws) differ from the
artifact's; the rates, sizes, durations, on/off rule and shapes are the paper's.
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


def uniform(
    rates: tuple[float, ...], duration_s: float, seed: int = 42, on_off_s: float | None = None
) -> list[Arrival]:
    """`generate_requests_uniform`: client i sends every 1/rate_i s from a random phase.

    With `on_off_s`, client 0's requests fall only in the even periods of that length
    (the artifact drops the others; the count of slots stays `int(rate * duration)`).
    """
    rng = random.Random(seed)
    arrivals: list[Arrival] = []
    for i, rate in enumerate(rates):
        t = rng.random() / rate
        for _ in range(int(rate * duration_s)):
            t += 1 / rate
            if on_off_s is not None and i == 0 and int(t // on_off_s) % 2 == 1:
                continue
            arrivals.append(Arrival(t, f"client{i}", 256, 256))
    return sorted(arrivals, key=lambda a: a.at)


def overload(seed: int = 42, duration_s: float = 360.0) -> list[Arrival]:
    return uniform((1.5, 3.0), duration_s, seed)


def proportional(seed: int = 42, duration_s: float = 600.0) -> list[Arrival]:
    return uniform((0.25, 0.5, 1.5), duration_s, seed)


def on_off_less(seed: int = 42, duration_s: float = 600.0) -> list[Arrival]:
    return uniform((0.5, 2.0), duration_s, seed, on_off_s=60.0)


def on_off_overload(seed: int = 42, duration_s: float = 600.0) -> list[Arrival]:
    return uniform((2.0, 3.0), duration_s, seed, on_off_s=60.0)


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
