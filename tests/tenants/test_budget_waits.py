"""`tenants.budget_waits.after_refusal`: a refused reservation waits for settlements only
when they can make room, and only within its bound; a refusal's Retry-After says when
room comes back."""

from __future__ import annotations

from tenants.budget_waits import Refuse, WaitInLine, after_refusal, counted_bound
from tenants.budgets import plan
from tenants.policy import TokenBudget

NOW = 1_767_225_630.0  # 2026-01-01T00:00:30Z: the minute ends in 30 s
CHARGE = plan("acme", (TokenBudget(1000, "minute"),), "m", 20, 80, NOW)[0]  # 100 tokens


def test_after_refusal_waits_when_settlements_can_make_room() -> None:
    """950 counted of which 900 held: spent 50 + 100 fits once they settle: wait, until
    the bound or the window's end, whichever is first."""
    assert after_refusal(CHARGE, 950, 900, NOW, NOW + 10, 0.0) == WaitInLine(NOW + 10)
    assert after_refusal(CHARGE, 950, 900, NOW, NOW + 3600, 0.0) == WaitInLine(NOW + 30)


def test_after_refusal_refuses_when_spent_leaves_no_room() -> None:
    """Spent 901 + 100 > 1000: no settlement helps; Retry-After is the window's end."""
    assert after_refusal(CHARGE, 1000, 99, NOW, NOW + 60, 0.0) == Refuse(30, spent=True)
    assert after_refusal(CHARGE, 1000, 100, NOW, NOW + 60, 0.0) == WaitInLine(NOW + 30)  # 900 + 100


def test_after_refusal_refuses_when_the_bound_is_over() -> None:
    """The bound has come: refused, Retry-After the time waited (at least 1 s, at most
    the window's end); a request that may not wait (bound now) gets 1 s."""
    assert after_refusal(CHARGE, 950, 900, NOW + 12, NOW + 12, 12.0) == Refuse(12, spent=False)
    assert after_refusal(CHARGE, 950, 900, NOW, NOW, 0.0) == Refuse(1, spent=False)
    assert after_refusal(CHARGE, 950, 900, NOW + 25, NOW + 20, 45.0) == Refuse(5, spent=False)


def test_counted_bound_is_the_engines_count_when_it_gave_one() -> None:
    """The engine's count replaces the byte bound, whichever side of it; without a count
    (None, or nonsense) the byte bound stays."""
    assert counted_bound(292, 8) == 8
    assert counted_bound(20, 25) == 25  # the allowance was short: the count is the truth
    assert counted_bound(292, None) == 292
    assert counted_bound(292, -1) == 292
