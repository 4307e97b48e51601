"""A tenant's refused clients are sent back one after another, not all into one place."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenants.ratelimit import RateLimiter, decide
from tenants.rates import Rate
from tests.tenants.test_ratelimit import T0, FakeClock, env_config

pytestmark = pytest.mark.timeout(30)

RATE = Rate(10, "minute")


async def test_ratelimiter_spreads_a_refused_batch() -> None:
    """Eight clients refused together get growing Retry-Afters, and each that comes back
    after exactly its own is admitted (with one value for all, only the first would be)."""
    clock = FakeClock()
    limiter = RateLimiter(env_config(DEFAULT_RATE_LIMIT="5req/min"), clock=clock)
    for _ in range(5):
        await limiter.check("t")
    clock.now += 30
    refused_at = clock.now
    retries = []
    for _ in range(8):
        decision = await limiter.hit("t")
        assert decision is not None and not decision.allowed
        retries.append(decision.retry_after_s)
    assert retries[0] == 31 and retries == sorted(retries) and len(set(retries)) == 8
    admitted = 0
    for retry in retries:
        clock.now = refused_at + retry
        decision = await limiter.hit("t")
        admitted += decision is not None and decision.allowed
    assert admitted == 8


async def test_ratelimiter_other_tenants_refusals_do_not_count() -> None:
    """Only the tenant's own refused clients push its Retry-After back."""
    clock = FakeClock()
    limiter = RateLimiter(env_config(DEFAULT_RATE_LIMIT="1req/min"), clock=clock)
    for tenant in ("a", "b"):
        await limiter.check(tenant)
    first_a = await limiter.hit("a")
    for _ in range(3):
        await limiter.hit("a")
    b = await limiter.hit("b")
    assert first_a is not None and b is not None
    assert b.retry_after_s == first_a.retry_after_s  # a's three still due back: not b's


@given(
    pending=st.integers(min_value=0, max_value=50),
    window=st.tuples(
        st.integers(min_value=0, max_value=20),
        st.floats(min_value=0.0, max_value=60.0),
        st.integers(min_value=10, max_value=20),
        st.floats(min_value=60.0, max_value=120.0),
    ),
)
def test_decide_retry_grows_with_pending(
    pending: int, window: tuple[int, float, int, float]
) -> None:
    """More refused clients due back never means an earlier return, and a whole limit of
    them pushes it back by about a window."""
    now = T0
    one = decide(False, RATE, 60, window, now, pending=pending)
    more = decide(False, RATE, 60, window, now, pending=pending + 1)
    later = decide(False, RATE, 60, window, now, pending=pending + RATE.amount)
    assert 1 <= one.retry_after_s <= more.retry_after_s
    assert later.retry_after_s >= one.retry_after_s + 59
    assert one.reset_at == int(now) + one.retry_after_s
