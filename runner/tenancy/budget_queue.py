"""The line of requests waiting for room in a token budget (tenants/budget_waits.py says
when a request waits; this is where it does).

One line per budget window's counter (tenant, budget, window), in priority, then
arrival order. Only the first of a line tries the store again, when it is its turn:

- a settlement of that counter in this process wakes the first at once;
- with the counters in another process (Redis, shared by replicas) the first also polls,
  every `poll_s[0]` seconds, doubling to `poll_s[1]` while nothing changes (another
  replica's settlements are seen there);
- whoever leaves the line (admitted, refused, gone) hands the turn to the next.

Why first-in-line and not everyone at each settlement: a large request is never starved
by a stream of small ones that fit sooner, and a settlement costs one retry, not one per
waiter. A request that arrives while others of its rank or above wait for the same
counter joins the line instead of trying (no barging). The store decides every retry
again, all or none: the order is fairness, never a bound.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable

RANKS = {"high": 0, "normal": 1, "low": 2}
"""A request's place by priority (lower first)."""


class LinePlace:
    """One request's place in a line."""

    __slots__ = ("future", "key", "poll_s", "rank", "seq", "woken")

    def __init__(self, key: str, rank: int, seq: int, poll_s: float) -> None:
        self.key = key
        self.rank = rank
        self.seq = seq
        self.poll_s = poll_s
        self.woken = False  # its turn came (a settlement, the one before it left)
        self.future: asyncio.Future[None] | None = None

    @property
    def order(self) -> tuple[int, int]:
        return self.rank, self.seq


class BudgetLine:
    """The lines, per counter key. `poll_s`: (first, longest) poll interval of the first
    in a line, with the counters in another process; None when every settlement is
    this process's own (memory): the first then waits for one, or its bound."""

    def __init__(self, poll_s: tuple[float, float] | None = None) -> None:
        self.poll_s = poll_s
        self._lines: dict[str, list[LinePlace]] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return sum(len(line) for line in self._lines.values())

    @property
    def waiting(self) -> bool:
        """Anyone in any line (the data path's one check when nobody waits)."""
        return bool(self._lines)

    def ahead(self, keys: Iterable[str], rank: int) -> str | None:
        """The first of these counters someone of `rank` or above waits for (None: none)."""
        lines = self._lines
        for key in keys:
            line = lines.get(key)
            if line and line[0].rank <= rank:
                return key
        return None

    def join(self, key: str, rank: int) -> LinePlace:
        ticket = LinePlace(key, rank, next(self._seq), self.poll_s[0] if self.poll_s else 0.0)
        self._insert(ticket)
        return ticket

    def move(self, ticket: LinePlace, key: str) -> None:
        """The ticket waits for another counter now, keeping its place by (rank, arrival)."""
        if key != ticket.key:
            self.leave(ticket)
            ticket.key = key
            self._insert(ticket)

    def leave(self, ticket: LinePlace) -> None:
        """Out of its line; the next one's turn if it was first."""
        line = self._lines.get(ticket.key)
        if line is None or ticket not in line:
            return
        was_first = line[0] is ticket
        line.remove(ticket)
        if not line:
            del self._lines[ticket.key]
        elif was_first:
            _wake(line[0])

    def settled(self, keys: Iterable[str]) -> None:
        """Settlements changed these counters: the first of each line tries again."""
        lines = self._lines
        if lines:
            for key in keys:
                line = lines.get(key)
                if line:
                    line[0].poll_s = self.poll_s[0] if self.poll_s else 0.0
                    _wake(line[0])

    def first(self, ticket: LinePlace) -> bool:
        line = self._lines.get(ticket.key)
        return line is not None and line[0] is ticket

    async def turn(self, ticket: LinePlace, timeout_s: float) -> None:
        """Return when it is this ticket's turn to try the store: it is first in its line
        and was woken, or (first, counters elsewhere) its poll interval passed while it
        was first; or when `timeout_s` passed (its bound, the window's end), first or
        not. A ticket put back by one ahead of it waits on, whatever woke it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            first = self.first(ticket)
            if ticket.woken and first:
                ticket.woken = False
                return
            left = deadline - loop.time()
            if left <= 0:
                return
            polling = self.poll_s is not None and first
            wait = min(left, ticket.poll_s) if polling else left
            future = ticket.future = loop.create_future()
            timer = loop.call_later(wait, _resolve, future)
            try:
                await future
            finally:
                timer.cancel()
                ticket.future = None
            if polling and not ticket.woken and self.first(ticket) and self.poll_s is not None:
                ticket.poll_s = min(2 * ticket.poll_s, self.poll_s[1])  # nothing changed
                return

    def _insert(self, ticket: LinePlace) -> None:
        line = self._lines.setdefault(ticket.key, [])
        i = len(line)
        while i > 0 and line[i - 1].order > ticket.order:
            i -= 1
        line.insert(i, ticket)  # first or not, it has just tried: it waits for a change


def _wake(ticket: LinePlace) -> None:
    ticket.woken = True
    if ticket.future is not None:
        _resolve(ticket.future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
