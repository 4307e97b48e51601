"""A seeded multi-model, multi-tenant trace for the swap benchmark.

One GPU of `capacity_mb` holds a pinned embedding model and a few of seven
chat/code/vision models that together need far more than it has. Twelve
tenants, each with a priority band (2 high, 6 normal, 4 low), work in
sessions: a burst of requests to one model at a few seconds' spacing, then an
idle gap. A tenant alternates between its two or three favourite models from
one session to the next (bursty, alternating demand: llama-swap #19, #612),
and some sessions go to the pinned embedding model. `mean_gap_s`, the mean
idle time between a tenant's sessions, sets how much the tenants' sessions
overlap, and so how hard the models compete for memory (`run.py` replays
three levels).

Loading a model takes `start_s + mem_mb / bandwidth_mb_s` (one load at a time:
one disk, one PCIe link); stopping one takes `stop_s`. A request's service
time is log-normal, its median growing with the model's size.

Everything comes from one `random.Random(seed)`: the same seed gives the same
trace, byte for byte.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    mem_mb: int
    concurrency: int
    pinned: bool = False


@dataclass(frozen=True, slots=True)
class Request:
    rid: int  # 1.. in arrival order
    at: float
    tenant: str
    band: str  # high | normal | low
    model: str
    service_s: float


@dataclass(frozen=True, slots=True)
class Trace:
    models: dict[str, Model]
    requests: list[Request]
    capacity_mb: int
    bandwidth_mb_s: float
    start_s: float
    stop_s: float
    seed: int
    params: dict[str, float] = field(default_factory=dict)

    def load_s(self, model: str) -> float:
        return self.start_s + self.models[model].mem_mb / self.bandwidth_mb_s


MODELS = (
    Model("embed-0.6b", 1_500, 8, pinned=True),
    Model("llama-8b", 9_000, 4),
    Model("vision-11b", 12_000, 2),
    Model("qwen-14b", 15_000, 4),
    Model("coder-32b", 20_000, 2),
    Model("mistral-24b", 24_000, 2),
    Model("llama-70b-q4", 40_000, 2),
)
BANDS = ("high",) * 2 + ("normal",) * 6 + ("low",) * 4


def generate(
    seed: int = 1,
    duration_s: float = 7200.0,
    *,
    capacity_mb: int = 48_000,
    bandwidth_mb_s: float = 2_000.0,
    start_s: float = 4.0,
    stop_s: float = 1.0,
    mean_burst: float = 8.0,
    mean_spacing_s: float = 3.0,
    mean_gap_s: float = 480.0,
    embed_share: float = 0.2,
) -> Trace:
    """The trace for `seed`: sessions of every tenant until `duration_s`."""
    rng = random.Random(seed)
    chat = [m.name for m in MODELS if not m.pinned]
    embed = next(m.name for m in MODELS if m.pinned)
    sizes = {m.name: m.mem_mb for m in MODELS}
    raw: list[tuple[float, str, str, str, float]] = []
    for i, band in enumerate(BANDS):
        tenant = f"tenant{i:02d}"
        favourites = rng.sample(chat, rng.choice((2, 3)))
        turn = 0
        t = rng.uniform(0.0, 60.0)
        while t < duration_s:
            if rng.random() < embed_share:
                model = embed
            else:
                model = favourites[turn % len(favourites)]
                turn += 1
            burst = 1 + int(rng.expovariate(1.0 / (mean_burst - 1)))
            for _ in range(burst):
                if t >= duration_s:
                    break
                median = 0.6 + 0.06 * sizes[model] / 1000
                service = median * math.exp(rng.gauss(0.0, 0.5))
                raw.append((t, tenant, band, model, service))
                t += rng.expovariate(1.0 / mean_spacing_s)
            t += rng.expovariate(1.0 / mean_gap_s)
    raw.sort(key=lambda r: (r[0], r[1]))
    requests = [Request(i, *r) for i, r in enumerate(raw, start=1)]
    params = {
        "duration_s": duration_s,
        "mean_burst": mean_burst,
        "mean_spacing_s": mean_spacing_s,
        "mean_gap_s": mean_gap_s,
        "embed_share": embed_share,
    }
    return Trace(
        {m.name: m for m in MODELS},
        requests,
        capacity_mb,
        bandwidth_mb_s,
        start_s,
        stop_s,
        seed,
        params,
    )
