"""The budget stores, memory and a real Redis, through one suite."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tenants.budget_store import BudgetStore, MemoryBudgetStore, RedisBudgetStore
from tenants.budgets import Reservation, plan, settle, window
from tenants.policy import TokenBudget
from tests.support.redis_cluster import redis_url

pytestmark = pytest.mark.timeout(30)

NOW = 1_767_225_630.0  # 2026-01-01T00:00:30Z
MINUTE = TokenBudget(100, "minute")
OUTPUT = TokenBudget(40, "hour", count="output", model="gemma-*")


@pytest.fixture(params=["memory", "redis", "cluster"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[BudgetStore]:
    if request.param == "memory":
        yield MemoryBudgetStore()
        return
    url = redis_url(request)  # a redis-server, or a three-node cluster
    redis_store = RedisBudgetStore.from_url(url, timeout_s=5.0)
    yield redis_store
    await redis_store.aclose()


async def test_budget_store_reserves_all_or_nothing(store: BudgetStore) -> None:
    """A request that does not fit one budget adds to none; the refused index is given."""
    charges = plan("acme", (MINUTE, OUTPUT), "gemma-3", 30, 30, NOW)
    assert await store.reserve(charges, NOW) == (0, (60, 30), 0)
    again = plan("acme", (MINUTE, OUTPUT), "gemma-3", 5, 20, NOW)  # output: 30 + 20 > 40
    refused, counters, held = await store.reserve(again, NOW)
    assert refused == 2 and counters[:2] == (60, 30) and held == 30
    assert await store.used([c.key for c in charges], NOW) == [60, 30]


async def test_budget_store_settles_to_what_was_used(store: BudgetStore) -> None:
    """Settling replaces the bound by the usage: the freed tokens fit another request."""
    charges = plan("acme", (MINUTE,), "smollm2", 50, 50, NOW)
    _, counters, _ = await store.reserve(charges, NOW)
    reservation = Reservation("acme", tuple(charges), counters)
    await store.adjust(settle(reservation, 12, 8), NOW)
    assert await store.used([charges[0].key], NOW) == [20]
    more = plan("acme", (MINUTE,), "smollm2", 40, 40, NOW)
    assert (await store.reserve(more, NOW))[0] == 0


async def test_budget_store_refusal_tells_spent_from_held(store: BudgetStore) -> None:
    """A refusal says what of the counter is held by requests not settled yet; a
    settlement releases its request's part, however much it used (0 included)."""
    first = plan("acme", (MINUTE,), "m", 30, 30, NOW)
    second = plan("acme", (MINUTE,), "m", 10, 10, NOW)
    _, after_first, _ = await store.reserve(first, NOW)
    _, after_second, _ = await store.reserve(second, NOW)
    assert (await store.reserve(plan("acme", (MINUTE,), "m", 11, 10, NOW), NOW)) == (1, (80,), 80)
    await store.adjust(settle(Reservation("acme", tuple(first), after_first), 5, 5), NOW)
    assert (await store.reserve(plan("acme", (MINUTE,), "m", 50, 41, NOW), NOW)) == (1, (30,), 20)
    await store.adjust(settle(Reservation("acme", tuple(second), after_second), 0, 0), NOW)
    assert (await store.reserve(plan("acme", (MINUTE,), "m", 50, 41, NOW), NOW)) == (1, (10,), 0)
    assert (await store.reserve(plan("acme", (MINUTE,), "m", 50, 40, NOW), NOW))[0] == 0


async def test_budget_store_windows_are_fixed_and_separate(store: BudgetStore) -> None:
    """The next minute is a new window with the whole budget; a tenant's counters are its own."""
    full = plan("acme", (MINUTE,), "m", 100, 0, NOW)
    assert (await store.reserve(full, NOW))[0] == 0
    assert (await store.reserve(plan("acme", (MINUTE,), "m", 1, 0, NOW), NOW))[0] == 1
    assert (await store.reserve(plan("other", (MINUTE,), "m", 100, 0, NOW), NOW))[0] == 0
    later = window("minute", NOW)[1] + 0.5
    assert (await store.reserve(plan("acme", (MINUTE,), "m", 100, 0, later), later))[0] == 0


async def test_budget_store_counter_never_goes_negative(store: BudgetStore) -> None:
    """A settlement larger than the counter (a stale reservation) floors it at 0."""
    charges = plan("acme", (MINUTE,), "m", 10, 0, NOW)
    await store.reserve(charges, NOW)
    await store.adjust([(charges[0].key, -50, 50)], NOW)
    assert await store.used([charges[0].key], NOW) == [0]


async def test_budget_store_amount_change_keeps_the_window(store: BudgetStore) -> None:
    """A budget raised from 100 to 150 keeps what its window used: 50 more fit, not 150."""
    assert (await store.reserve(plan("acme", (MINUTE,), "m", 100, 0, NOW), NOW))[0] == 0
    raised = TokenBudget(150, "minute")
    assert (await store.reserve(plan("acme", (raised,), "m", 60, 0, NOW), NOW))[0] == 1
    assert (await store.reserve(plan("acme", (raised,), "m", 50, 0, NOW), NOW))[0] == 0


def test_budget_windows_are_utc_calendar_windows() -> None:
    """Minute, hour and day windows are aligned to UTC; a month is the calendar month."""
    assert window("minute", NOW) == (1_767_225_600, 1_767_225_660)
    assert window("hour", NOW) == (1_767_225_600, 1_767_229_200)
    assert window("day", NOW) == (1_767_225_600, 1_767_312_000)
    feb = window("month", 1_769_904_000.0 + 5)  # 2026-02-01T00:00:05Z
    assert feb == (1_769_904_000, 1_772_323_200)  # to 2026-03-01
    assert window("month", 1_796_083_200.0 - 1)[1] == 1_796_083_200  # December -> January
