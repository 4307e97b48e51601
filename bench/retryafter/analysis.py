"""What a returning client found: admitted or not, and how long it waited beyond need.

Input is every attempt the clients made (`Attempt`, from the HTTP client or the replay).
A refused attempt (503 `queue_full`, 429) is followed by the same client's next attempt
exactly `Retry-After` seconds later: the *return*.

The queue is reconstructed from the attempts that got in: each waited in it from the
moment it was sent until it was granted (sent + the runner's `X-Queue-Wait-Ms`) or until
it timed out. From that timeline, for each 503 `queue_full` refusal at time r:

- *needed*: the time from r until the queue first had a free place (depth below
  `MAX_QUEUE_DEPTH`); a client back at that instant would have got in;
- *needed, whole seconds*: the smallest whole number of seconds n >= 1 such that the
  queue had a free place at r + n: the best `Retry-After` there was, in hindsight
  (`Retry-After` is whole seconds, and the runner never says 0).

Beside it, *needed in line*: the refused clients form a line in refusal order, and a
client with m - 1 others still waiting to get in ahead of it needs the m-th place to open
after r (whole seconds). It is the wait a client could not avoid if the runner handed the
places out in refusal order and new arrivals took none (they do take some, so it is an
optimistic bound and the over-wait against it is pessimistic). It tells a `Retry-After`
that spreads a crowd of refused clients apart from one that waits for nothing.

For a 429 `rate_limit_exceeded` the place is room in the tenant's rate limit: the
tenant's requests that passed the limiter are replayed, at their wall-clock times, into the
runner's own sliding-window store (`tenants.memory_store.MemoryWindowStorage`, the algorithm
of the `limits` library), which is read, never hit, at r + n.

The over-wait is `Retry-After` / needed-in-whole-seconds: 1 is perfect, above 1 the client
waited longer than it had to, below 1 it came back too early (and was refused again).
Both are measured against what the runner actually did, including the returns themselves;
a client coming back sooner could have taken a place another one got.
"""

from __future__ import annotations

import asyncio
import bisect
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from tenants.memory_store import MemoryWindowStorage
from tenants.rates import parse_rate

QUEUE_FULL = "queue_full"
RATE_LIMITED = "rate_limit_exceeded"
SEARCH_S = 120  # how far ahead to look for a free place


@dataclass(slots=True)
class Attempt:
    """One request as its client saw it; times in seconds from the run's start."""

    client: int
    attempt: int  # 0: the fresh request; 1, 2, ...: returns after Retry-After
    sent: float
    done: float = 0.0
    status: int = 0  # 0: no answer
    code: str = ""  # error code for non-200
    retry_after: int | None = None
    queue_wait_s: float | None = None  # from X-Queue-Wait-Ms on 200 answers
    tenant: str = ""

    @property
    def admitted(self) -> bool:
        """It got past admission (served, or waited until the queue timeout)."""
        return self.status == 200 or self.code == "queue_timeout"

    @property
    def refused(self) -> bool:
        return self.retry_after is not None and not self.admitted and self.status in (429, 503)


class QueueTimeline:
    """Queue depth over time from the waits of admitted attempts."""

    def __init__(self, attempts: list[Attempt]) -> None:
        events: list[tuple[float, int]] = []
        for a in attempts:
            end = self._left_queue(a)
            if end is not None and end > a.sent:
                events += [(a.sent, 1), (end, -1)]
        events.sort()
        self.times = [t for t, _ in events]
        self.departures = [t for t, d in events if d < 0]  # a place opens at each
        depth, self.depth_after = 0, []
        for _, d in events:
            depth += d
            self.depth_after.append(depth)

    @staticmethod
    def _left_queue(a: Attempt) -> float | None:
        if a.status == 200 and a.queue_wait_s is not None:
            return a.sent + a.queue_wait_s
        if a.code == "queue_timeout":
            return a.done
        return None

    def depth_before(self, t: float) -> int:
        """Requests waiting just before `t` (an arrival at `t` sees this many)."""
        i = bisect.bisect_left(self.times, t)
        return self.depth_after[i - 1] if i else 0

    def openings(self, t0: float, t1: float, max_depth: int) -> int:
        """Places that opened in (t0, t1]: free at t0, plus one per request leaving."""
        free = max(0, max_depth - self.depth_before(t0))
        left = bisect.bisect_right(self.departures, t1) - bisect.bisect_right(self.departures, t0)
        return free + left

    def first_free(self, t: float, max_depth: int) -> float | None:
        """The first time >= `t` with fewer than `max_depth` waiting."""
        if self.depth_before(t) < max_depth:
            return t
        i = bisect.bisect_left(self.times, t)
        for j in range(i, len(self.times)):
            if self.depth_after[j] < max_depth:
                return self.times[j]
        return None


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile, `q` in 0..100 (nan if empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def analyse(
    attempts: list[Attempt],
    max_depth: int,
    end_s: float,
    rates: Mapping[str, str] | None = None,
    wall_start: float = 0.0,
) -> dict[str, object]:
    """Share of returns admitted and over-waits, per refusal code and together.

    `rates`: the tenants' rate limits as configured (`30req/min`), for 429s; `wall_start`:
    the wall-clock time of the attempts' zero. Refusals whose return would fall after
    `end_s` (the end of the trace) are left out.
    """
    timeline = QueueTimeline(attempts)
    room = _rate_room(attempts, rates or {}, wall_start)
    by_client: dict[int, dict[int, Attempt]] = {}
    for a in attempts:
        by_client.setdefault(a.client, {})[a.attempt] = a
    returns: dict[str, list[bool]] = {}
    over: dict[str, list[float]] = {}
    over_continuous: list[float] = []
    over_line: list[float] = []
    line = _Line(attempts)
    needed_whole: list[float] = []
    given: dict[str, Counter[int]] = {}
    censored = 0
    for a in attempts:
        if not a.refused or a.retry_after is None:
            continue
        back = by_client[a.client].get(a.attempt + 1)
        if back is None or back.status == 0 or a.done + a.retry_after > end_s:
            continue
        key = f"{a.status} {a.code}"
        returns.setdefault(key, []).append(back.admitted)
        given.setdefault(key, Counter())[a.retry_after] += 1
        if a.code == QUEUE_FULL:
            first = timeline.first_free(a.done, max_depth)
            if first is not None:
                over_continuous.append(a.retry_after / max(first - a.done, 1e-3))
            whole = next(
                (n for n in range(1, SEARCH_S) if timeline.depth_before(a.done + n) < max_depth),
                None,
            )
            ahead = line.ahead(a)
            in_line = next(
                (
                    n
                    for n in range(1, SEARCH_S)
                    if timeline.openings(a.done, a.done + n, max_depth) > ahead
                ),
                None,
            )
            if in_line is not None:
                over_line.append(a.retry_after / in_line)
        elif a.code == RATE_LIMITED and (a.client, a.attempt) in room:
            whole = room[a.client, a.attempt]
        else:
            continue
        if whole is None:
            censored += 1
            continue
        needed_whole.append(whole)
        over.setdefault(key, []).append(a.retry_after / whole)
    all_returns = [ok for oks in returns.values() for ok in oks]
    all_over = [x for xs in over.values() for x in xs]
    return {
        "refusals": {k: len(v) for k, v in sorted(returns.items())},
        "admitted_on_return": _share(all_returns),
        "admitted_on_return_by_code": {k: _share(v) for k, v in sorted(returns.items())},
        "over_wait": _dist(all_over),
        "over_wait_by_code": {k: _dist(v) for k, v in sorted(over.items())},
        "over_wait_continuous_queue_full": _dist(over_continuous),
        "over_wait_in_line_queue_full": _dist(over_line),
        "needed_whole_s": _dist(needed_whole),
        "retry_after_given": {k: dict(sorted(c.items())) for k, c in sorted(given.items())},
        "censored": censored,
        "attempts": len(attempts),
        "clients": len(by_client),
        "admitted_finally": sum(
            1 for tries in by_client.values() if any(t.admitted for t in tries.values())
        ),
    }


def _rate_room(
    attempts: list[Attempt], rates: Mapping[str, str], wall_start: float
) -> dict[tuple[int, int], int | None]:
    """For each 429 (client, attempt): the smallest whole n >= 1 with room at refusal + n."""
    return asyncio.run(_rate_room_async(attempts, rates, wall_start)) if rates else {}


async def _rate_room_async(
    attempts: list[Attempt], rates: Mapping[str, str], wall_start: float
) -> dict[tuple[int, int], int | None]:
    out: dict[tuple[int, int], int | None] = {}
    for tenant, text in rates.items():
        rate = parse_rate(text)
        limit, expiry = rate.amount, rate.period_s
        # (time, 0: probe / 1: hit, (client, attempt), n)
        events: list[tuple[float, int, tuple[int, int], int]] = []
        for a in attempts:
            if a.tenant != tenant or a.status == 0:
                continue
            if a.status == 429 and a.code == RATE_LIMITED:
                out[a.client, a.attempt] = None
                who = (a.client, a.attempt)
                events += [(a.done + n, 0, who, n) for n in range(1, SEARCH_S)]
            else:
                events.append((a.sent, 1, (a.client, a.attempt), 0))
        events.sort()
        clock = _Clock()
        store = MemoryWindowStorage(clock=clock)
        for at, kind, who, n in events:
            clock.now = wall_start + at
            if kind == 1:
                await store.acquire_sliding_window_entry("k", limit, expiry)
                continue
            if out[who] is not None:
                continue
            previous, previous_ttl, current, _ = await store.get_sliding_window("k", expiry)
            if math.floor(previous * previous_ttl / expiry + current) + 1 <= limit:
                out[who] = n
    return out


class _Line:
    """Who was refused (`queue_full`) and not yet in again, at any moment."""

    def __init__(self, attempts: list[Attempt]) -> None:
        # per client: (refused at, back in at or inf) for each stretch spent outside
        self._out: list[tuple[float, float]] = []
        by_client: dict[int, list[Attempt]] = {}
        for a in attempts:
            by_client.setdefault(a.client, []).append(a)
        for tries in by_client.values():
            tries.sort(key=lambda t: t.attempt)
            for i, t in enumerate(tries):
                if t.code != QUEUE_FULL or (i and tries[i - 1].code == QUEUE_FULL):
                    continue
                back = next((u.sent for u in tries[i + 1 :] if u.admitted), math.inf)
                self._out.append((t.done, back))

    def ahead(self, a: Attempt) -> int:
        """Clients refused before `a` and still outside when it was refused."""
        return sum(1 for since, back in self._out if since < a.done < back)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _share(oks: list[bool]) -> float:
    return sum(oks) / len(oks) if oks else math.nan


def _dist(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p10": pct(values, 10),
        "p50": pct(values, 50),
        "p90": pct(values, 90),
        "max": max(values, default=math.nan),
    }
