"""The overload trace with mixed deadlines that `run.py` replays (seeded, documented).

Two classes of request, Poisson arrivals each, for `duration_s` seconds:

| class       | share of capacity | priority | deadline | tokens in / out       | tenants |
|-------------|-------------------|----------|----------|-----------------------|---------|
| interactive | 0.6x              | high     | 2 s      | U(50, 300) / U(50, 150)   | 4   |
| batch       | 1.4x              | low      | 60 s     | U(500, 2000) / U(200, 600)| 2   |

Together they offer 2x what the engine can serve. The engine (`sim.py`) has `SLOTS`
slots, each processing `SLOT_RATE` weighted tokens per second (input x1, output x2), so an
interactive request holds a slot 0.5 s on average and a batch one 2.7 s.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tenants.fairness import service_cost

SLOTS = 4
SLOT_RATE = 750.0  # weighted tokens per second per slot


@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    share: float  # of the engine's capacity
    priority: str
    deadline_ms: int
    tokens_in: tuple[int, int]
    tokens_out: tuple[int, int]
    tenants: int

    @property
    def mean_service_s(self) -> float:
        mean_in = sum(self.tokens_in) / 2
        mean_out = sum(self.tokens_out) / 2
        return service_cost(round(mean_in), round(mean_out)) / SLOT_RATE


INTERACTIVE = Kind("interactive", 0.6, "high", 2_000, (50, 300), (50, 150), 4)
BATCH = Kind("batch", 1.4, "low", 60_000, (500, 2000), (200, 600), 2)
KINDS = (INTERACTIVE, BATCH)


@dataclass(frozen=True, slots=True)
class Arrival:
    at: float
    kind: Kind
    tenant: str
    input_tokens: int
    output_tokens: int

    @property
    def service_s(self) -> float:
        return service_cost(self.input_tokens, self.output_tokens) / SLOT_RATE


def generate(seed: int, duration_s: float) -> list[Arrival]:
    """The seeded trace, in arrival order."""
    rng = random.Random(seed)
    arrivals: list[Arrival] = []
    for kind in KINDS:
        rate = kind.share * SLOTS / kind.mean_service_s  # requests per second
        t = rng.expovariate(rate)
        while t < duration_s:
            arrivals.append(
                Arrival(
                    t,
                    kind,
                    f"{kind.name}-{rng.randrange(kind.tenants)}",
                    rng.randint(*kind.tokens_in),
                    rng.randint(*kind.tokens_out),
                )
            )
            t += rng.expovariate(rate)
    arrivals.sort(key=lambda a: a.at)
    return arrivals
