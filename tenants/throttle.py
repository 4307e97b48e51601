"""Events counted per key within a sliding window, and who must wait before the next one:
failed authentications per source address and per claimed tenant (tenants/identity.py),
lifecycle calls per source address (runner/http/control_plane.py).

A key with `rate.amount` events within the last `rate.period_s` seconds waits until the
oldest of them leaves the window: that wait is the `Retry-After`. For failed
authentications only failures are added; a success never resets a count either (a guesser
who also holds one valid key gains nothing). Memory is bounded: at most `max_keys` keys are
kept, the key whose last event is oldest going first, and each key keeps at most
`rate.amount` times.

Per process (each replica counts its own): the point is to make guessing slow, which any
bound does, and a shared store on the failure path would be a Redis write per guess.
The clock is injected; nothing here reads time by itself.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from math import ceil

from tenants.rates import Rate

Clock = Callable[[], float]
MAX_KEYS = 10_000


class RecentEvents:
    """Events per key within a sliding window of `rate.period_s` seconds."""

    def __init__(self, rate: Rate, clock: Clock, max_keys: int = MAX_KEYS) -> None:
        self.rate = rate
        self._clock = clock
        self._max_keys = max_keys
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def __bool__(self) -> bool:
        """Whether any key holds events (so the common path checks nothing otherwise)."""
        return bool(self._failures)

    def retry_after(self, key: str) -> int:
        """Seconds `key` must wait (0: it may try now).

        1. No events kept for the key: 0.
        2. Events older than the window are dropped.
        3. Fewer than `rate.amount` left: 0; else until the oldest leaves the window
           (whole seconds, at least 1).
        """
        times = self._failures.get(key)
        if times is None:  # 1
            return 0
        now = self._clock()
        period = self.rate.period_s
        while times and times[0] <= now - period:  # 2
            times.popleft()
        if not times:
            del self._failures[key]
            return 0
        if len(times) < self.rate.amount:  # 3
            return 0
        return max(1, ceil(times[0] + period - now))

    def add(self, key: str) -> None:
        """Count one event for `key` now."""
        times = self._failures.get(key)
        if times is None:
            if len(self._failures) >= self._max_keys:
                self._failures.popitem(last=False)
            times = self._failures[key] = deque(maxlen=self.rate.amount)
        else:
            self._failures.move_to_end(key)
        times.append(self._clock())
