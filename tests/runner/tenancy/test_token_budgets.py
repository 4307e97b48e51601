"""`runner/tenancy/token_budgets.Budgets`, the data path's side of token budgets: reserve the
bounds, answer with the tightest budget's headers, settle to what was used (at once with
the counters in this process, in the background with Redis)."""

from __future__ import annotations

import pytest

from runner.tenancy.token_budgets import Budgets
from tenants.budget_store import MemoryBudgetStore, RedisBudgetStore
from tenants.config import TenantPolicy
from tenants.errors import RequestExceedsBudget, TokenBudgetExceeded
from tenants.policy import TokenBudget
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.timeout(30)

NOW = 1_767_225_630.0  # 2026-01-01T00:00:30Z
POLICY = TenantPolicy(
    token_budgets=(
        TokenBudget(1000, "minute"),
        TokenBudget(300, "hour", count="output", model="gemma-*"),
    )
)


def _headers(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in headers}


async def test_budgets_memory_settles_at_once() -> None:
    """With the counters in this process, a settlement is applied before `settle` returns
    (nothing left in the background), and the freed tokens fit the next request."""
    store = MemoryBudgetStore()
    budgets = Budgets(store, clock=lambda: NOW)
    held, _ = await budgets.reserve("acme", POLICY, "gemma-3", 600, 200)
    assert held is not None
    keys = [c.key for c in held.reservation.charges]
    assert await store.used(keys, NOW) == [800, 200]
    budgets.settle(held, 40, 10)
    assert await store.used(keys, NOW) == [50, 10]
    budgets.settle(held, 600, 200)  # once per hold
    assert await store.used(keys, NOW) == [50, 10]
    again, _ = await budgets.reserve("acme", POLICY, "gemma-3", 600, 200)
    assert again is not None


async def test_budgets_headers_name_the_tightest_budget() -> None:
    """The tokens trio is the budget with the fewest tokens left after the reservation;
    a model only the minute budget applies to gets that one's."""
    budgets = Budgets(MemoryBudgetStore(), clock=lambda: NOW)
    _, headers = await budgets.reserve("acme", POLICY, "gemma-3", 100, 250)
    assert _headers(headers) == {
        "x-ratelimit-limit-tokens": "300",
        "x-ratelimit-remaining-tokens": "50",
        "x-ratelimit-reset-tokens": "59m30s",  # the hour's end
    }
    _, headers = await budgets.reserve("acme", POLICY, "smollm2", 100, 250)
    assert _headers(headers) == {
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "300",  # 1000 - 350 - 350
        "x-ratelimit-reset-tokens": "30s",
    }


async def test_budgets_refusals_name_the_budget() -> None:
    """A charge above its whole budget is 400; one that does not fit what is left is 429
    naming the budget, and nothing is reserved by either."""
    store = MemoryBudgetStore()
    budgets = Budgets(store, clock=lambda: NOW)
    with pytest.raises(RequestExceedsBudget):
        await budgets.reserve("acme", POLICY, "gemma-3", 10, 301)
    held, _ = await budgets.reserve("acme", POLICY, "gemma-3", 10, 290)
    assert held is not None
    with pytest.raises(TokenBudgetExceeded) as refused:
        await budgets.reserve("acme", POLICY, "gemma-3", 10, 20)
    assert refused.value.fields["budget_text"] == "300 output tokens per hour of gemma-*"
    assert await store.used([c.key for c in held.reservation.charges], NOW) == [300, 290]


async def test_budgets_redis_settles_in_the_background(redis_server: RedisServer) -> None:
    """With Redis, the settlement goes out in the background; once it is done the
    counters hold what was used."""
    store = RedisBudgetStore.from_url(redis_server.url, timeout_s=5.0)
    budgets = Budgets(store, clock=lambda: NOW)
    try:
        held, _ = await budgets.reserve("redis-acme", POLICY, "gemma-3", 600, 200)
        assert held is not None
        budgets.settle(held, 40, 10)
        await budgets.idle()
        keys = [c.key for c in held.reservation.charges]
        assert await store.used(keys, NOW) == [50, 10]
    finally:
        await store.aclose()
