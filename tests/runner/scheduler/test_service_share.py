"""`ServiceTimes.share_above` from running per-band sums: the same share as summing every
grant of the window, at a cost that does not grow with the grants (the forecast gauges
read it at each /metrics scrape)."""

from __future__ import annotations

import random

import pytest

from runner.scheduler.deadlines import SHARE_WINDOW_S, ServiceTimes
from runner.scheduler.events import Ticket
from runner.scheduler.grants import AdmissionRequest
from runner.scheduler.waiting import Band

pytestmark = pytest.mark.timeout(30)


def _ticket(i: int, band: Band, cost: int) -> Ticket:
    request = AdmissionRequest(f"r{i}", "m", "t", band.label, cost, 0)
    return Ticket(i, request, band, cost, 0.0)


def test_service_share_above_matches_the_sum_over_the_window() -> None:
    """For random grants over 100 s, read at random moments, the share each band sees
    above it equals the share computed from every grant younger than the window."""
    rng = random.Random(18)
    times = ServiceTimes()
    grants: list[tuple[float, Band, int]] = []
    now = 0.0
    for i in range(3000):
        now += rng.expovariate(30)
        band, cost = rng.choice(list(Band)), rng.randint(1, 50)
        times.started(_ticket(i, band, cost), now)
        grants.append((now, band, max(cost, 1)))
        if i % 97 == 0:
            read_at = now + rng.uniform(0, 5)
            for b in Band:
                work = sum(c for at, g, c in grants if g > b and read_at - at <= SHARE_WINDOW_S)
                expected = work * 0.01 / (SHARE_WINDOW_S * 4)
                assert times.share_above("m", b, read_at, 0.01, 4) == pytest.approx(expected)
            now = read_at
