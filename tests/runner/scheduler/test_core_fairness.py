"""Fair share under flooding: VTC keeps backlogged tenants' service within its bound."""

from __future__ import annotations

from runner.scheduler.config import SchedulerConfig
from tenants.fairness import service_cost
from tests.runner.scheduler.fakes import Driver

STEP_S = 0.05
TOKENS_PER_S = 2000.0  # per slot, weighted tokens


def flood(
    fair: bool, rates: dict[str, float], tokens: dict[str, tuple[int, int]], seconds: float
) -> list[float]:
    """Run tenants flooding at `rates` (req/s) against 2 slots; return |service difference| samples.

    Service is the weighted tokens granted to each tenant; a sample is taken
    at every step while both tenants have requests waiting.
    """
    config = SchedulerConfig(
        default_concurrency=2, max_queue_depth=100_000, queue_timeout_s=None, fair=fair
    )
    d = Driver(config)
    owner: dict[int, str] = {}
    finish: dict[int, float] = {}
    served = dict.fromkeys(rates, 0.0)
    next_arrival = dict.fromkeys(rates, 0.0)
    samples: list[float] = []
    seen = 0
    while d.now < seconds:
        for tenant, rate in rates.items():
            while next_arrival[tenant] <= d.now:
                owner[d.arrive(tenant, tokens=tokens[tenant])] = tenant
                next_arrival[tenant] += 1 / rate
        for ticket_id in [t for t, end in finish.items() if end <= d.now]:
            del finish[ticket_id]
            d.done(ticket_id)
        for ticket_id, _ in d.effects.granted[seen:]:
            tenant = owner[ticket_id]
            cost = service_cost(*tokens[tenant])
            served[tenant] += cost
            finish[ticket_id] = d.now + cost / TOKENS_PER_S
        seen = len(d.effects.granted)
        if d.core.waiting_tenants() == set(rates):
            a, b = served.values()
            samples.append(abs(a - b))
        d.now += STEP_S
    return samples


def test_fairness_flooding_at_one_to_two_gets_equal_service() -> None:
    """Two tenants flooding at 1:2 rates receive equal service within the VTC bound (2U)."""
    tokens = {"a": (100, 100), "b": (100, 100)}
    bound = 2 * service_cost(100, 100)
    fair = flood(True, {"a": 10.0, "b": 20.0}, tokens, 60.0)
    fcfs = flood(False, {"a": 10.0, "b": 20.0}, tokens, 60.0)
    assert fair and max(fair) <= bound
    assert max(fcfs) > 10 * bound  # the same load without VTC drifts apart


def test_fairness_counts_tokens_not_requests() -> None:
    """A tenant sending many short requests gets the same tokens as one sending long ones."""
    tokens = {"short": (25, 25), "long": (200, 200)}
    bound = 2 * service_cost(200, 200)
    fair = flood(True, {"short": 80.0, "long": 10.0}, tokens, 60.0)
    assert fair and max(fair) <= bound
