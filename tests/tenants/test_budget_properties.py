"""Token budgets never overshoot (Hypothesis): whatever the interleaving of reservations,
settlements (whole, streamed or cancelled), replicas and time, the tokens used by the
requests admitted in any window of any budget stay within that budget.

The machine drives one store shared by several replicas (each with its own requests in
flight), memory and a real Redis alike; the engine reports usage at most the reserved
bound (prompt and max_tokens), and a cancelled request reports what it generated so far.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
)

from tenants.budget_store import BudgetStore, MemoryBudgetStore, RedisBudgetStore
from tenants.budgets import GRACE_S, Reservation, plan, settle, window
from tenants.policy import TokenBudget
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.timeout(300)

BUDGETS = (
    TokenBudget(200, "minute"),
    TokenBudget(120, "minute", count="output", model="gemma-*"),
    TokenBudget(500, "hour", count="input"),
    TokenBudget(900, "day", model="smol*"),
)
MODELS = ("gemma-3", "smollm2", "other")
START = 1_767_225_600.0  # 2026-01-01T00:00:00Z
TENANT_IDS = itertools.count()


@dataclass
class InFlight:
    replica: int
    model: str
    reservation: Reservation
    input_bound: int
    output_bound: int
    admitted_at: float


class BudgetMachine(RuleBasedStateMachine):
    """Replicas reserve and settle against one store; time moves forward."""

    store: BudgetStore
    loop: asyncio.AbstractEventLoop

    requests = Bundle("requests")

    def __init__(self) -> None:
        super().__init__()
        self.now = START
        # (tenant, budget key, window start) -> tokens used by requests settled so far,
        # and those still in flight at their bound
        self.used: dict[tuple[str, str, int], int] = defaultdict(int)
        self.flying: list[InFlight] = []

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    @initialize()
    def fresh_tenant(self) -> None:
        """Each example starts on counters of its own (a new tenant id in the store)."""
        self.tenant = f"t{next(TENANT_IDS)}"  # never reused (an `id()` is, once freed)

    @rule(
        target=requests,
        replica=st.integers(0, 2),
        model=st.sampled_from(MODELS),
        prompt=st.integers(0, 80),
        max_tokens=st.integers(0, 80),
    )
    def reserve(self, replica: int, model: str, prompt: int, max_tokens: int) -> object:
        charges = plan(self.tenant, BUDGETS, model, prompt, max_tokens, self.now)
        refused, counters, _ = self.run(self.store.reserve(charges, self.now))
        if refused:
            return None
        request = InFlight(
            replica,
            model,
            Reservation(self.tenant, tuple(charges), counters),
            prompt,
            max_tokens,
            self.now,
        )
        self.flying.append(request)
        return request

    @rule(
        request=consumes(requests),
        prompt_share=st.floats(0, 1),
        output_share=st.floats(0, 1),
        cancelled=st.booleans(),
    )
    def finish(
        self, request: InFlight | None, prompt_share: float, output_share: float, cancelled: bool
    ) -> None:
        """The engine reports at most the bounds; a cancelled stream what it generated."""
        if request is None or request not in self.flying:
            return
        self.flying.remove(request)
        used_in = round(request.input_bound * prompt_share)
        used_out = round(request.output_bound * output_share * (0.5 if cancelled else 1))
        deltas = settle(request.reservation, used_in, used_out)
        self.run(self.store.adjust(deltas, self.now))
        for charge in request.reservation.charges:
            start, _ = window(charge.budget.per, request.admitted_at)
            key = (self.tenant, charge.budget.key, start)
            self.used[key] += charge.budget.amount(used_in, used_out)

    @rule(seconds=st.sampled_from([0.5, 7, 31, 59, 61, 600, 3599, 86_400]))
    def advance(self, seconds: float) -> None:
        self.now += seconds

    @invariant()
    def no_overshoot(self) -> None:
        """Used by settled requests plus the bounds of those in flight, per window, is
        within the budget (so what they finally use is too)."""
        totals = dict(self.used)
        for request in self.flying:
            for charge in request.reservation.charges:
                start, _ = window(charge.budget.per, request.admitted_at)
                key = (self.tenant, charge.budget.key, start)
                totals[key] = totals.get(key, 0) + charge.amount
        limits = {b.key: b.tokens for b in BUDGETS}
        for (_, budget_key, _), used in totals.items():
            assert used <= limits[budget_key]

    @invariant()
    def held_is_what_is_in_flight(self) -> None:
        """Each live counter's held part is the sum of the reservations of its requests
        in flight (what a waiting request may still get back), exactly."""
        flying: dict[str, int] = defaultdict(int)
        for request in self.flying:
            for charge in request.reservation.charges:
                if charge.window_end + GRACE_S > self.now + 1:
                    flying[charge.key] += charge.amount
        keys = sorted(flying)
        assert self.run(self.store.held(keys, self.now)) == [flying[k] for k in keys]


def _run_machine(store_factory, examples: int) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.new_event_loop()
    store = loop.run_until_complete(_make(store_factory))

    class Machine(BudgetMachine):
        pass

    Machine.store = store
    Machine.loop = loop
    try:
        Machine.TestCase.settings = settings(
            max_examples=examples,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        Machine.TestCase().runTest()
    finally:
        loop.run_until_complete(store.aclose())
        loop.close()


async def _make(factory):  # type: ignore[no-untyped-def]
    return factory()


@pytest.fixture(scope="module")
def shared_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


def test_budget_never_overshoots_in_memory() -> None:
    """In-memory store: no window of any budget ever holds more than the budget."""
    _run_machine(MemoryBudgetStore, 300)


def test_budget_never_overshoots_in_redis(shared_redis: RedisServer) -> None:
    """Redis store (the Lua scripts), replicas sharing it: no window overshoots."""
    _run_machine(lambda: RedisBudgetStore.from_url(shared_redis.url, timeout_s=5.0), 60)
