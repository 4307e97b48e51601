"""The overload traces of the Retry-After bench, as arrival times of fresh requests.

Both are drawn in advance with a seeded `random.Random` (times in seconds from the start,
each with a tenant) and scaled to the engine's capacity (requests per second it completes).
Refused clients come back on top of them (`client.py`, `sim.py`).

- `spikes`: the case `Retry-After` is for. A background of Poisson arrivals at 0.4x
  capacity from tenants t0-t2, and every `SPIKE_EVERY_S` seconds one tenant (t3) submits a
  batch at once (within 0.2 s): 20-40 requests, more than a slot and a full queue hold
  (ComfyUI's "queue 24 prompts"). The queue then drains while the background runs; a
  client refused from the batch should be told when its place will be free.
- `bursts`: sustained overload. Poisson arrivals at 3x capacity for 6 s, then 0.25x for
  24 s, repeated (0.8x on average); tenants t0-t3. While a burst lasts, whoever arrives
  first after a completion takes the freed place, so a client coming back during the
  burst is mostly refused again whatever it was told; only a `Retry-After` past the end of
  the burst (which the runner cannot know) gets it in.

Each starts with `WARMUP_S` seconds at 0.4x capacity, so the runner has seen some load.
"""

from __future__ import annotations

import random
from collections.abc import Callable

Arrivals = list[tuple[float, str]]

WARMUP_S = 10.0
SPIKE_EVERY_S = 20.0
SPIKE_SIZE = (20, 40)
BURST = (6.0, 3.0)  # seconds, load as a multiple of capacity
LULL = (24.0, 0.25)


def _poisson(
    rng: random.Random, rate: float, start: float, end: float, tenants: list[str]
) -> Arrivals:
    out: Arrivals = []
    t = start + rng.expovariate(rate)
    while t < end:
        out.append((t, tenants[rng.randrange(len(tenants))]))
        t += rng.expovariate(rate)
    return out


def spikes(capacity_rps: float, cycles: int, seed: int = 1) -> Arrivals:
    rng = random.Random(seed)
    background = ["t0", "t1", "t2"]
    end = WARMUP_S + cycles * SPIKE_EVERY_S
    out = _poisson(rng, 0.4 * capacity_rps, 0.0, end, background)
    for i in range(cycles):
        at = WARMUP_S + i * SPIKE_EVERY_S
        size = rng.randint(*SPIKE_SIZE)
        out += [(at + rng.uniform(0.0, 0.2), "t3") for _ in range(size)]
    return sorted(out)


def bursts(capacity_rps: float, cycles: int, seed: int = 1) -> Arrivals:
    rng = random.Random(seed)
    tenants = ["t0", "t1", "t2", "t3"]
    out = _poisson(rng, 0.4 * capacity_rps, 0.0, WARMUP_S, tenants)
    start = WARMUP_S
    for _ in range(cycles):
        for seconds, load in (BURST, LULL):
            out += _poisson(rng, load * capacity_rps, start, start + seconds, tenants)
            start += seconds
    return out


def duration_s(kind: str, cycles: int) -> float:
    cycle = SPIKE_EVERY_S if kind == "spikes" else BURST[0] + LULL[0]
    return WARMUP_S + cycles * cycle


TRACES: dict[str, Callable[[float, int, int], Arrivals]] = {"spikes": spikes, "bursts": bursts}
