"""Token budgets that never overshoot: reserve an upper bound at admission, settle on usage.

A budget (`tenants.policy.TokenBudget`) counts tokens in fixed UTC windows (the minute,
hour, day or calendar month). Each window has one counter per tenant and budget: what
was reserved for requests admitted in it, corrected to what they used once they ended.

    admission   plan(...) -> one Charge per budget that applies, each an upper bound of
                what the request can cost it; the store's `reserve` checks every counter
                and adds every charge, all or none, in one step (memory: one synchronous
                call; Redis: one Lua script, one round trip)
    the end     settle(reservation, used) -> per counter, used minus reserved (<= 0 while
                the bound holds) and the reservation it releases; the store's `adjust`
                applies both (a key whose window has expired is left alone)

Beside each counter the store keeps what is `held`: the part of it reserved by requests
not settled yet. So a refusal tells the caller both what the window has spent (counter
minus held: no settlement gives it back) and what settlements may still free; the
caller decides whether to wait for them (tenants/budget_waits.py).

A request is charged to the window it was admitted in. Since a counter only grows by
reservations that fit under the budget, and only shrinks when a request used less than
its bound, the tokens served by the requests admitted in a window never exceed the budget,
whatever the interleaving of reservations, settlements and replicas (the property
`tests/tenants/test_budget_properties.py` checks). The bound is the caller's duty
(runner/tenancy/guard.py: prompt bytes plus the chat template's allowance, and max_tokens
or the model's context).

`BudgetBook` is the accounting itself, pure, with an injected time; the memory store is a
`BudgetBook`, and the Redis store's scripts do exactly what it does.

On the data path every admitted request plans and reserves, so `Plans` keeps what depends
only on the policy (per tenant and model: the budgets that apply and their counters'
names) and the current windows, and gives exactly `plan`'s charges; `Charge` and
`Reservation` are named tuples (immutable, and cheap to make once per request).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

from tenants.policy import TokenBudget

GRACE_S = 300
"""A window's counter outlives the window by this long, so a late settlement finds it."""
_SECONDS = {"minute": 60, "hour": 3600, "day": 86400}


def window(per: str, now: float) -> tuple[int, int]:
    """The fixed UTC window `now` falls in: (start, end), Unix seconds."""
    size = _SECONDS.get(per)
    if size is not None:
        start = int(now // size) * size
        return start, start + size
    moment = datetime.fromtimestamp(now, UTC)
    first = datetime(moment.year, moment.month, 1, tzinfo=UTC)
    following = datetime(moment.year + moment.month // 12, moment.month % 12 + 1, 1, tzinfo=UTC)
    return int(first.timestamp()), int(following.timestamp())


class Charge(NamedTuple):
    """What one request reserves against one budget's current window."""

    budget: TokenBudget
    key: str  # the window's counter: tenant, budget identity, window start
    amount: int
    window_end: int

    @property
    def limit(self) -> int:
        return self.budget.tokens

    def ttl_s(self, now: float) -> int:
        return max(1, math.ceil(self.window_end - now) + GRACE_S)


class ReserveAttempt(NamedTuple):
    """A store's answer to `reserve`: `refused` 0 when every charge was added (then
    `counters` are the counters after), else the refused charge's index + 1 (then
    `counters` the counters read, and `held` the refused counter's tokens reserved by
    requests not settled yet)."""

    refused: int
    counters: tuple[int, ...]
    held: int = 0


class Reservation(NamedTuple):
    """Charges reserved together for one request, and the counters right after."""

    tenant: str
    charges: tuple[Charge, ...]
    counters: tuple[int, ...]


def counter_key(tenant: str, budget: TokenBudget, start: int) -> str:
    return f"{tenant}|{budget.key}|{start}"


def plan(
    tenant: str,
    budgets: Sequence[TokenBudget],
    model: str,
    input_bound: int,
    output_bound: int,
    now: float,
) -> list[Charge]:
    """The charges of one request: for each budget that applies to `model`, the most it
    can cost in the budget's current window (`budget.amount` of the bounds)."""
    charges = []
    for budget in budgets:
        if budget.applies_to(model):
            start, end = window(budget.per, now)
            key = counter_key(tenant, budget, start)
            charges.append(Charge(budget, key, budget.amount(input_bound, output_bound), end))
    return charges


class Plans:
    """`plan`, with what depends only on the policy worked out once: per (tenant, model)
    and budgets (the policy's own tuple: a new policy is a new tuple), the budgets that
    apply and their counters' names; per period, the window `now` is in. The charges are
    exactly `plan`'s. At most `max_entries` (tenant, model) pairs are kept (in open mode
    a default policy's budgets meet any tenant id): past that, the memo starts afresh."""

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self._applying: dict[tuple[str, str], _Applying] = {}
        self._windows: dict[str, tuple[int, int]] = {}

    def plan(
        self,
        tenant: str,
        budgets: tuple[TokenBudget, ...],
        model: str,
        input_bound: int,
        output_bound: int,
        now: float,
    ) -> list[Charge]:
        applying = self._applying.get((tenant, model))
        if applying is None or applying.budgets is not budgets:
            if len(self._applying) >= self.max_entries:
                self._applying.clear()
            applying = self._applying[(tenant, model)] = _Applying(
                budgets,
                tuple((b, f"{tenant}|{b.key}|") for b in budgets if b.applies_to(model)),
            )
        charges = []
        windows = self._windows
        for budget, prefix in applying.prefixes:
            known = windows.get(budget.per)  # the window, worked out again only when left
            if known is None or not known[0] <= now < known[1]:
                known = windows[budget.per] = window(budget.per, now)
            amount = budget.amount(input_bound, output_bound)
            charges.append(Charge(budget, f"{prefix}{known[0]}", amount, known[1]))
        return charges


@dataclass(frozen=True, slots=True)
class _Applying:
    budgets: tuple[TokenBudget, ...]  # the policy's, as planned for (compared by identity)
    prefixes: tuple[tuple[TokenBudget, str], ...]  # those that apply; `counter_key` less start


Settlement = tuple[str, int, int]
"""(counter key, what to add to the counter, what to release from its held part)."""


def settle(reservation: Reservation, used_in: int, used_out: int) -> list[Settlement]:
    """Per counter, what to apply once the request ended: its cost with the tokens it
    used (`used_in`, `used_out`) minus its reserved cost, and its reserved cost released
    from what is held. Usage above a bound is charged as used (never under-counted),
    which only a wrong bound can cause."""
    settlements = []
    for charge in reservation.charges:
        delta = charge.budget.amount(used_in, used_out) - charge.amount
        if delta or charge.amount:
            settlements.append((charge.key, delta, charge.amount))
    return settlements


class BudgetBook:
    """The counters, in memory; every call completes without awaiting (atomic on the
    event loop: the one lock an in-process store needs)."""

    SWEEP_ABOVE = 1024
    """Expired counters are swept once the book holds more than this, and again each time
    it has doubled since (so a sweep costs O(1) per reservation, however many are live)."""

    def __init__(self) -> None:
        # key -> (count, held: reserved and not settled, expires at)
        self._counters: dict[str, tuple[int, int, float]] = {}
        self._sweep_above = self.SWEEP_ABOVE

    def __len__(self) -> int:
        return len(self._counters)

    def reserve(self, charges: Sequence[Charge], now: float) -> ReserveAttempt:
        """All charges or none.

        1. Read each counter (an expired one reads 0).
        2. The first charge that does not fit (counter + amount > budget): refused, and
           nothing is added; return its index + 1, the counters read and its held part.
        3. Add every charge to its counter and its held part; return 0 and the counters
           after.
        """
        counters = self._counters
        used = []  # 1
        for charge in charges:
            entry = counters.get(charge.key)
            used.append(entry[0] if entry is not None and entry[2] > now else 0)
        for i, charge in enumerate(charges):  # 2
            if used[i] + charge.amount > charge.budget.tokens:
                entry = counters.get(charge.key)
                held = entry[1] if entry is not None and entry[2] > now else 0
                return ReserveAttempt(i + 1, tuple(used), held)
        for i, charge in enumerate(charges):  # 3
            used[i] += charge.amount
            entry = counters.get(charge.key)
            held = entry[1] if entry is not None and entry[2] > now else 0
            ttl_s = max(1, math.ceil(charge.window_end - now) + GRACE_S)  # `Charge.ttl_s`
            counters[charge.key] = (used[i], held + charge.amount, now + ttl_s)
        if len(counters) > self._sweep_above:
            self._sweep(now)
            self._sweep_above = max(self.SWEEP_ABOVE, 2 * len(counters))
        return ReserveAttempt(0, tuple(used))

    def adjust(self, settlements: Sequence[Settlement], now: float) -> None:
        """Add each delta to its counter and release from its held part, if the counter
        still exists; neither below 0."""
        for key, delta, released in settlements:
            entry = self._counters.get(key)
            if entry is not None and entry[2] > now:
                count, held, expires = entry
                self._counters[key] = (max(0, count + delta), max(0, held - released), expires)

    def used(self, key: str, now: float) -> int:
        entry = self._counters.get(key)
        if entry is None or entry[2] <= now:
            return 0
        return entry[0]

    def held(self, key: str, now: float) -> int:
        """The part of `used` reserved by requests not settled yet."""
        entry = self._counters.get(key)
        if entry is None or entry[2] <= now:
            return 0
        return entry[1]

    def _sweep(self, now: float) -> None:
        for key in [k for k, (_, _, expires) in self._counters.items() if expires <= now]:
            del self._counters[key]
