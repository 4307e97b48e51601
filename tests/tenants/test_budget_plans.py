"""`tenants.budgets` as the data path uses it: `Plans`, the memo of `plan`, gives exactly
`plan`'s charges whatever the tenant, model, bounds, time and policy changes; the book
sweeps expired counters without scanning them on every reservation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenants.budgets import GRACE_S, BudgetBook, Plans, plan, window
from tenants.policy import TokenBudget

pytestmark = pytest.mark.timeout(60)

START = 1_767_225_600.0  # 2026-01-01T00:00:00Z
BUDGETS = (
    TokenBudget(200, "minute"),
    TokenBudget(120, "minute", count="output", model="gemma-*"),
    TokenBudget(500, "hour", count="input"),
    TokenBudget(900, "day", model="smol*"),
    TokenBudget(5000, "month", model="gemma-3"),
)
budget_sets = st.lists(st.sampled_from(BUDGETS), unique=True).map(tuple)


@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(("acme", "team-1", "default")),
            budget_sets,
            st.sampled_from(("gemma-3", "gemma-2", "smollm2", "other")),
            st.integers(0, 10_000),
            st.integers(0, 4096),
            st.floats(-86_400 * 40, 86_400 * 40),
        ),
        max_size=40,
    ),
    max_entries=st.integers(1, 8),
)
def test_plans_equal_plan_whatever_the_order(
    steps: list[tuple[str, tuple[TokenBudget, ...], str, int, int, float]], max_entries: int
) -> None:
    """Any sequence of requests (time going back and forth across windows and months,
    policies changing, the memo overflowing) gets `plan`'s charges, in `plan`'s order."""
    plans = Plans(max_entries)
    for tenant, budgets, model, input_bound, output_bound, offset in steps:
        now = START + offset
        expected = plan(tenant, budgets, model, input_bound, output_bound, now)
        assert plans.plan(tenant, budgets, model, input_bound, output_bound, now) == expected


def test_plans_follow_a_new_policy_at_once() -> None:
    """A policy change is a new budgets tuple: the next request is planned on it, even for
    the same tenant and model (an equal tuple from a rebuilt policy gives equal charges)."""
    plans = Plans()
    old = (TokenBudget(100, "minute"),)
    new = (TokenBudget(100, "minute"), TokenBudget(50, "hour", count="output"))
    assert len(plans.plan("acme", old, "m", 10, 10, START)) == 1
    charges = plans.plan("acme", new, "m", 10, 10, START)
    assert [c.budget for c in charges] == list(new)
    assert plans.plan("acme", (), "m", 10, 10, START) == []


def test_plans_window_moves_with_time() -> None:
    """A request in the next window is charged to the next window's counter."""
    plans = Plans()
    minute = (TokenBudget(100, "minute"),)
    first = plans.plan("acme", minute, "m", 1, 1, START + 59.5)[0]
    second = plans.plan("acme", minute, "m", 1, 1, START + 60.0)[0]
    assert first.key != second.key
    assert second.window_end == window("minute", START + 60.0)[1]
    assert plans.plan("acme", minute, "m", 1, 1, START + 59.9)[0] == first


def test_budget_book_sweeps_expired_counters_as_it_grows() -> None:
    """Counters whose window (and grace) has passed are dropped once the book outgrows its
    sweep mark; live ones stay, and so does what they hold."""
    book = BudgetBook()
    minute = (TokenBudget(100, "minute"),)
    for i in range(BudgetBook.SWEEP_ABOVE):
        assert book.reserve(plan(f"t{i}", minute, "m", 1, 0, START), START)[0] == 0
    later = START + 60 + GRACE_S + 1
    live = plan("live", minute, "m", 5, 0, later)
    book.reserve(live, later)
    book.reserve(plan("another", minute, "m", 5, 0, later), later)  # past the mark: sweep
    assert len(book) <= 2
    assert book.used(live[0].key, later) == 5
