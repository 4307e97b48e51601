"""Waiting vs refusal: what a request whose reservation did not fit does next.

A budget's counter is what its window has spent plus what requests in flight reserved
and have not settled yet (`held`). Reserving the whole bound up front keeps the budget
exact, but a burst of requests that each reserve far more than they use would be
refused while most of the budget is only reserved, never spent. So a refusal is
final only when settlements cannot help:

    spent + amount > limit     nothing in flight can give room back: refused, and the
                               room comes back with the next window (`Retry-After`: its
                               end)
    the wait's bound is over   refused (`Retry-After`: the bound it waited, at most the
                               window's end)
    otherwise                  wait for a settlement (or the window's end), then try
                               again: the store decides again, all or none, so waiting
                               never lets more than the budget be reserved

`after_refusal` is that decision, pure; runner/tenancy/budget_queue.py does the waiting.

Before a request waits or is refused, its prompt's bound may be made exact: the runner
bounds a prompt by its body's bytes plus a template allowance (always enough, often ten
times too much), and a kind whose engines count prompts is asked to count this one
(adapters/prompt_tokens.py). `counted_bound` is what the reservation is tried again with.
A request that fits at once is never counted.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from tenants.budgets import Charge


class WaitInLine(NamedTuple):
    """Wait for a settlement of this counter, at most until `until` (then try again)."""

    until: float


class Refuse(NamedTuple):
    """Refused for good: `retry_after_s` says when room comes back; `spent` is true when
    the spent tokens leave no room (else the wait's bound ran out)."""

    retry_after_s: int
    spent: bool


def after_refusal(
    charge: Charge, counter: int, held: int, now: float, give_up_at: float, waited_s: float
) -> WaitInLine | Refuse:
    """What a request does when `charge` did not fit its counter (`counter` tokens, of
    which `held` reserved by requests not settled yet), having waited `waited_s` so far.

    1. What the window has spent (counter - held) plus the charge exceeds the budget: no
       settlement can make room, only the next window: Refuse, Retry-After its end.
    2. The wait's bound has come (`give_up_at`: the request's deadline, the wait setting;
       at `now` for a request that may not wait): Refuse, Retry-After the smaller of the
       window's end and how long the reservations in flight held the room (`waited_s`,
       at least 1 s: they settle as their requests end).
    3. Otherwise WaitInLine, until the bound or the window's end, whichever comes first (a new
       window has the whole budget).
    """
    to_window_end = max(1, math.ceil(charge.window_end - now))
    if counter - held + charge.amount > charge.limit:  # 1
        return Refuse(to_window_end, spent=True)
    if now >= give_up_at:  # 2
        return Refuse(min(to_window_end, max(1, math.ceil(waited_s))), spent=False)
    return WaitInLine(min(give_up_at, float(charge.window_end)))  # 3


def counted_bound(bound: int, counted: int | None) -> int:
    """The prompt's bound after its engine was asked to count it (`counted`).

    1. The engine could not tell (None: no count, a part it does not count as text, no
       answer in time): the byte bound stays.
    2. Else the count: the prompt tokens the engine's answer will report (the chat
       template applied as the engine applies it), whichever side of the byte bound it
       falls (above it, the bound's allowance was short and the count is the truth).
    """
    if counted is None or counted < 0:  # 1
        return bound
    return counted  # 2
