"""`Budgets.reserve` waiting for room (runner/tenancy/token_budgets.py): a request whose
bound does not fit only because others' reservations have not settled waits in line and
is admitted when they settle; it is refused when the spent tokens leave no room or its
bound runs out; the line goes by priority, then arrival; a waiter that is cancelled
leaves nothing reserved. Memory and a real Redis, with one or two `Budgets` (replicas)
on the store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Sequence

import pytest

from runner.tenancy.token_budgets import Budgets, Held
from tenants.budget_store import (
    BudgetStore,
    BudgetStoreUnavailable,
    MemoryBudgetStore,
    RedisBudgetStore,
)
from tenants.budgets import Charge, ReserveAttempt, Settlement, window
from tenants.config import TenantPolicy
from tenants.errors import RequestExceedsBudget, TokenBudgetExceeded, TokenBudgetUnavailable
from tenants.policy import TokenBudget
from tests.support.poll import eventually_async
from tests.support.ports import free_port
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.timeout(60)

NOW = 1_767_225_630.0  # 2026-01-01T00:00:30Z
POLICY = TenantPolicy(token_budgets=(TokenBudget(1000, "minute"),))
BOUND = (20, 80)  # each request reserves 100 tokens
USED = (5, 10)  # and uses 15


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[BudgetStore]:
    if request.param == "memory":
        yield MemoryBudgetStore()
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    redis_store = RedisBudgetStore.from_url(server.url, timeout_s=5.0)
    yield redis_store
    await redis_store.aclose()


async def reserve(
    budgets: Budgets, tenant: str, wait_s: float = 30.0, priority: str = "normal"
) -> Held:
    held, _ = await budgets.reserve(tenant, POLICY, "m", *BOUND, wait_s=wait_s, priority=priority)
    assert held is not None
    return held


async def test_budget_waits_burst_uses_the_budget(store: BudgetStore) -> None:
    """100 requests at once, each reserving 100 and using 15, against a 1000 budget (on
    two replicas with Redis): settled one by one, every request waits or is served; >= 90%
    of the budget is used and never more; the refused are refused for the spent tokens."""
    count = 1 if store.book is not None else 2  # memory: one process, one `Budgets`
    replicas = [Budgets(store, clock=lambda: NOW) for _ in range(count)]
    engine: asyncio.Queue[tuple[Budgets, Held] | None] = asyncio.Queue()  # None: refused

    async def request(i: int) -> None:
        budgets = replicas[i % count]
        try:
            held = await reserve(budgets, "burst")
        except TokenBudgetExceeded as refused:
            assert refused.headers["Retry-After"] == "30"  # the window's end
            await engine.put(None)
            return
        await engine.put((budgets, held))

    clients = [asyncio.create_task(request(i)) for i in range(100)]
    spent = served = 0
    for _ in range(100):  # the engine: one request at a time, each settled as it ends
        async with asyncio.timeout(20):
            admitted = await engine.get()
        if admitted is not None:
            budgets, held = admitted
            budgets.settle(held, *USED)
            await budgets.idle()
            spent, served = spent + sum(USED), served + 1
    await asyncio.gather(*clients)
    assert 0.9 * 1000 <= spent <= 1000
    assert served < 100  # the demand is above the budget: the last are refused
    assert not any(budgets.line.waiting for budgets in replicas)


async def test_budget_waits_refused_at_once_when_spent(store: BudgetStore) -> None:
    """With 950 of 1000 spent (settled), a request of 100 is refused at once (no
    settlement can help), Retry-After the window's end."""
    budgets = Budgets(store, clock=lambda: NOW)
    budgets.settle(await reserve(budgets, "spent"), 900, 50)
    await budgets.idle()
    with pytest.raises(TokenBudgetExceeded) as refused:
        await reserve(budgets, "spent", wait_s=3600)
    assert refused.value.headers["Retry-After"] == "30"
    assert not budgets.line.waiting


async def test_budget_waits_until_its_bound_then_refused(store: BudgetStore) -> None:
    """Reservations that never settle: a waiter is refused once its bound is over,
    Retry-After at least 1 s, and nothing of it stays reserved."""
    budgets = Budgets(store)
    for _ in range(10):
        await reserve(budgets, "held")
    with pytest.raises(TokenBudgetExceeded) as refused:
        await reserve(budgets, "held", wait_s=0.05)
    assert int(refused.value.headers["Retry-After"]) >= 1
    assert not budgets.line.waiting
    key = f"held|{POLICY.token_budgets[0].key}|{window('minute', budgets._clock())[0]}"
    assert await store.used([key], budgets._clock()) == [1000]


async def test_budget_waits_in_priority_then_arrival_order(store: BudgetStore) -> None:
    """The budget full of unsettled reservations; waiters low, normal, high, normal join
    in turn; each settlement frees room for one: high, normal, normal, low."""
    budgets = Budgets(store, clock=lambda: NOW)
    holds = [await reserve(budgets, "order") for _ in range(10)]
    order: list[str] = []

    async def waiter(name: str, priority: str) -> Held:
        held = await reserve(budgets, "order", priority=priority)
        order.append(name)
        return held

    tasks = []
    for n, (name, priority) in enumerate(
        [("low", "low"), ("normal-1", "normal"), ("high", "high"), ("normal-2", "normal")]
    ):
        tasks.append(asyncio.create_task(waiter(name, priority)))
        await eventually_async(lambda n=n: len(budgets.line) == n + 1)  # type: ignore[misc]
    for k in range(4):
        budgets.settle(holds[k], 0, 0)  # used nothing: room for one more
        await eventually_async(lambda k=k: len(order) == k + 1)  # type: ignore[misc]
    await asyncio.gather(*tasks)
    assert order == ["high", "normal-1", "normal-2", "low"]


async def test_budget_waits_cancelled_leaves_nothing(store: BudgetStore) -> None:
    """A waiter cancelled (its client gone) leaves the line and reserves nothing; the
    next settlement admits the one behind it."""
    budgets = Budgets(store, clock=lambda: NOW)
    holds = [await reserve(budgets, "gone") for _ in range(10)]
    first = asyncio.create_task(reserve(budgets, "gone"))
    await eventually_async(lambda: len(budgets.line) == 1)
    second = asyncio.create_task(reserve(budgets, "gone"))
    await eventually_async(lambda: len(budgets.line) == 2)
    first.cancel()
    await eventually_async(lambda: len(budgets.line) == 1)
    key = holds[0].reservation.charges[0].key
    assert await store.used([key], NOW) == [1000] and await store.held([key], NOW) == [1000]
    budgets.settle(holds[0], 0, 0)  # used nothing: room for one
    async with asyncio.timeout(20):
        await second
    assert await store.used([key], NOW) == [1000] and await store.held([key], NOW) == [1000]
    assert first.cancelled() and not budgets.line.waiting


async def test_budget_waits_a_new_window_admits(store: BudgetStore) -> None:
    """A waiter whose window ends is admitted in the next one, whole."""
    now = [NOW + 29.9]  # 0.1 s before the minute's end
    budgets = Budgets(store, clock=lambda: now[0])
    for _ in range(10):
        await reserve(budgets, "roll")
    waiter: Awaitable[Held] = asyncio.create_task(reserve(budgets, "roll"))
    await eventually_async(lambda: budgets.line.waiting)
    now[0] = NOW + 31  # the next minute
    async with asyncio.timeout(20):
        held = await waiter
    assert held.reservation.counters == (100,)


async def test_budget_waits_store_unreachable_fails_closed_or_open() -> None:
    """Redis unreachable: 503 `token_budget_unavailable`, or no reservation at all when
    failing open; nobody is left in line."""
    store = RedisBudgetStore.from_url(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.5)
    try:
        with pytest.raises(TokenBudgetUnavailable):
            await Budgets(store).reserve("down", POLICY, "m", *BOUND, wait_s=5)
        open_budgets = Budgets(store, fail_open=True)
        assert await open_budgets.reserve("down", POLICY, "m", *BOUND, wait_s=5) == (None, [])
        assert not open_budgets.line.waiting
    finally:
        await store.aclose()


class _LosesOneSettlement:
    """Counters in this process, reached as if across the network; the first
    settlement is lost (the store unreachable)."""

    book = None

    def __init__(self) -> None:
        self.counters = MemoryBudgetStore()
        self.lost = 0

    async def aclose(self) -> None:
        return None

    async def reserve(self, charges: Sequence[Charge], now: float) -> ReserveAttempt:
        return await self.counters.reserve(charges, now)

    async def adjust(self, settlements: Sequence[Settlement], now: float) -> None:
        if not self.lost:
            self.lost += 1
            raise BudgetStoreUnavailable("down for a moment")
        await self.counters.adjust(settlements, now)

    async def held(self, keys: Sequence[str], now: float) -> list[int]:
        return await self.counters.held(keys, now)

    async def used(self, keys: Sequence[str], now: float) -> list[int]:
        return await self.counters.used(keys, now)


async def test_budget_waits_a_lost_settlement_releases_what_it_held() -> None:
    """A settlement lost to the store stays charged at its bound, but its held part is
    released again: a waiter then sees the window spent and is refused, instead of
    waiting out its bound for a settlement that will never come."""
    store = _LosesOneSettlement()
    budgets = Budgets(store, clock=lambda: NOW)
    budgets.RELEASE_RETRIES_S = (0.0,)
    holds = [await reserve(budgets, "lost") for _ in range(10)]
    key = holds[0].reservation.charges[0].key
    waiter = asyncio.create_task(reserve(budgets, "lost", wait_s=3600))
    await eventually_async(lambda: budgets.line.waiting)
    budgets.settle(holds[0], *USED)  # lost: 100 stays charged, its 100 released later
    await budgets.idle()
    assert await store.used([key], NOW) == [1000] and await store.held([key], NOW) == [900]
    for held in holds[1:]:
        budgets.settle(held, *BOUND)  # used all: the window is spent
    with pytest.raises(TokenBudgetExceeded) as refused:
        async with asyncio.timeout(20):
            await waiter
    assert refused.value.headers["Retry-After"] == "30"  # the window's end: spent


class _Counter:
    """The engine's count of a prompt (`Budgets.reserve`'s `count`), and how often it was
    asked."""

    def __init__(self, tokens: int | None) -> None:
        self.tokens = tokens
        self.asked = 0

    async def __call__(self) -> int | None:
        self.asked += 1
        return self.tokens


async def test_budget_waits_a_request_that_fits_is_never_counted(store: BudgetStore) -> None:
    """A request whose byte bound fits at once is reserved with it: its prompt is never
    counted."""
    budgets = Budgets(store, clock=lambda: NOW)
    count = _Counter(5)
    held, _ = await budgets.reserve("fits", POLICY, "m", *BOUND, count=count)
    assert held is not None and held.input_bound == BOUND[0]
    assert count.asked == 0


async def test_budget_waits_counted_before_it_waits(store: BudgetStore) -> None:
    """With 900 of 1000 held, a request whose byte bound (300 + 80) does not fit is
    counted once (5 prompt tokens) and reserved at once with 5 + 80; a count that does not
    help (none) leaves it as it was: refused (here it may not wait)."""
    budgets = Budgets(store, clock=lambda: NOW)
    for _ in range(9):
        await reserve(budgets, "counted")
    count = _Counter(5)
    held, _ = await budgets.reserve("counted", POLICY, "m", 300, 80, count=count, wait_s=0)
    assert held is not None and held.input_bound == 5
    assert held.reservation.counters == (985,)
    assert count.asked == 1
    silent = _Counter(None)
    with pytest.raises(TokenBudgetExceeded):
        await budgets.reserve("counted", POLICY, "m", 300, 80, count=silent, wait_s=0)
    assert silent.asked == 1


async def test_budget_waits_counted_before_it_is_refused_as_too_large(
    store: BudgetStore,
) -> None:
    """A byte bound larger than the whole budget (1200 + 80 of 1000) is counted before
    the 400: 30 + 80 is reserved; a count still too large is refused 400
    `request_exceeds_budget`."""
    budgets = Budgets(store, clock=lambda: NOW)
    held, _ = await budgets.reserve("large", POLICY, "m", 1200, 80, count=_Counter(30))
    assert held is not None and held.reservation.counters == (110,)
    with pytest.raises(RequestExceedsBudget):
        await budgets.reserve("large", POLICY, "m", 1200, 80, count=_Counter(950))
