"""An in-process sliding-window-counter store for the `limits` library, with an injected clock.

`limits.aio.storage.MemoryStorage` reads `time.time()` itself, takes an asyncio lock and
schedules an expiry task on every hit (about 16 us per hit plus window read here). This store
implements the same storage contract (`Storage` + `SlidingWindowCounterSupport`, the same
timestamped window keys and TTL arithmetic) without locks or tasks: nothing in it awaits, so
each call is atomic on the event loop. Time comes from `clock`, so tests move time instead of
sleeping. Expired counters are swept at most once per `sweep_interval_s`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from math import floor

from limits.aio.storage import SlidingWindowCounterSupport, Storage
from limits.storage.base import TimestampedSlidingWindow

Clock = Callable[[], float]
Window = tuple[int, float, int, float]
"""(previous count, previous TTL s, current count, current TTL s), as storages report it."""


class MemoryWindowStorage(Storage, SlidingWindowCounterSupport, TimestampedSlidingWindow):
    """Counters with expiry in a dict: key -> (count, expires_at)."""

    STORAGE_SCHEME = None

    def __init__(self, clock: Clock = time.time, sweep_interval_s: float = 10.0) -> None:
        super().__init__(None)
        self._clock = clock
        self._counters: dict[str, tuple[int, float]] = {}
        self._sweep_interval_s = sweep_interval_s
        self._next_sweep = clock() + sweep_interval_s

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        return ValueError

    def __len__(self) -> int:
        """Counters currently held (expired ones count until swept)."""
        return len(self._counters)

    # -- the plain counter contract -------------------------------------------------------

    async def incr(self, key: str, expiry: float, amount: int = 1) -> int:
        return self._incr(key, expiry, amount, self._clock())

    async def get(self, key: str) -> int:
        return self._get(key, self._clock())

    async def get_expiry(self, key: str) -> float:
        now = self._clock()
        entry = self._counters.get(key)
        return entry[1] if entry is not None and entry[1] > now else now

    async def check(self) -> bool:
        return True

    async def reset(self) -> int | None:
        count = len(self._counters)
        self._counters.clear()
        return count

    async def clear(self, key: str) -> None:
        self._counters.pop(key, None)

    # -- the sliding window counter contract ----------------------------------------------

    async def acquire_sliding_window_entry(
        self, key: str, limit: int, expiry: int, amount: int = 1
    ) -> bool:
        now = self._clock()
        previous_key, current_key = self.sliding_window_keys(key, expiry, now)
        return self._acquire(previous_key, current_key, limit, expiry, amount, now)

    async def acquire_and_read(self, key: str, limit: int, expiry: int) -> tuple[bool, Window]:
        """`acquire_sliding_window_entry` then `get_sliding_window`, in one call (one clock
        read, one key computation: it is the rate limiter's call on every request)."""
        now = self._clock()
        previous_key, current_key = self.sliding_window_keys(key, expiry, now)
        window = self._window(previous_key, current_key, expiry, now)
        if not self._admits(window, limit, expiry, 1):
            return False, window
        self._incr(current_key, 2 * expiry, 1, now)
        # the window read again would differ by this entry only: the previous count is
        # live (it was read > 0, or is 0), the current one was live or is new
        previous, previous_ttl, current, current_ttl = window
        return True, (previous, previous_ttl, current + 1, current_ttl)

    async def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        now = self._clock()
        previous_key, current_key = self.sliding_window_keys(key, expiry, now)
        return self._window(previous_key, current_key, expiry, now)

    async def clear_sliding_window(self, key: str, expiry: int) -> None:
        previous_key, current_key = self.sliding_window_keys(key, expiry, self._clock())
        self._counters.pop(previous_key, None)
        self._counters.pop(current_key, None)

    # -- internals (synchronous: atomic on the event loop) --------------------------------

    def _acquire(
        self, previous_key: str, current_key: str, limit: int, expiry: int, amount: int, now: float
    ) -> bool:
        if not self._admits(
            self._window(previous_key, current_key, expiry, now), limit, expiry, amount
        ):
            return False
        self._incr(current_key, 2 * expiry, amount, now)
        return True

    @staticmethod
    def _admits(window: Window, limit: int, expiry: int, amount: int) -> bool:
        """Whether `amount` more entries fit in `limit` with `window` counted."""
        if amount > limit:
            return False
        previous, previous_ttl, current, _ = window
        return floor(previous * previous_ttl / expiry + current) + amount <= limit

    def _get(self, key: str, now: float) -> int:
        entry = self._counters.get(key)
        if entry is None:
            return 0
        if entry[1] <= now:
            del self._counters[key]
            return 0
        return entry[0]

    def _incr(self, key: str, expiry: float, amount: int, now: float) -> int:
        if now >= self._next_sweep:
            self._sweep(now)
        entry = self._counters.get(key)
        if entry is None or entry[1] <= now:
            self._counters[key] = (amount, now + expiry)
            return amount
        count = entry[0] + amount
        self._counters[key] = (count, entry[1])
        return count

    def _window(
        self, previous_key: str, current_key: str, expiry: int, now: float
    ) -> tuple[int, float, int, float]:
        """Counts and TTLs exactly as `limits`' own memory storage reports them."""
        previous = self._get(previous_key, now)
        current = self._get(current_key, now)
        previous_ttl = 0.0 if previous == 0 else (1 - (((now - expiry) / expiry) % 1)) * expiry
        current_ttl = (1 - ((now / expiry) % 1)) * expiry + expiry
        return previous, previous_ttl, current, current_ttl

    def _sweep(self, now: float) -> None:
        self._next_sweep = now + self._sweep_interval_s
        expired = [key for key, (_, expires_at) in self._counters.items() if expires_at <= now]
        for key in expired:
            del self._counters[key]
