"""Measurements the scheduler reports: queue waits and how fast the queue drains.

Both look back over a sliding window on the injected clock, so they describe
recent load, not the process's lifetime.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

MAX_SAMPLES = 4096


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A snapshot for `/v1/capabilities` and metrics."""

    depth: int
    max_depth: int
    depth_by_priority: dict[str, int]
    avg_wait_ms: int
    p95_wait_ms: int
    drain_per_s: float
    in_flight: dict[str, int]

    def capabilities(self) -> dict[str, int]:
        """The seed's `queue` section of `/v1/capabilities`."""
        return {
            "depth": self.depth,
            "maxDepth": self.max_depth,
            "avgWaitMs": self.avg_wait_ms,
            "p95WaitMs": self.p95_wait_ms,
        }


class WaitWindow:
    """Queue waits of granted requests over the last `window_s` seconds."""

    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._samples: deque[tuple[float, float]] = deque(maxlen=MAX_SAMPLES)

    def record(self, at: float, wait_s: float) -> None:
        self._samples.append((at, max(wait_s, 0.0)))

    def _recent(self, now: float) -> list[float]:
        while self._samples and now - self._samples[0][0] > self._window_s:
            self._samples.popleft()
        return [wait for _, wait in self._samples]

    def avg_ms(self, now: float) -> int:
        waits = self._recent(now)
        return round(1000 * sum(waits) / len(waits)) if waits else 0

    def p95_ms(self, now: float) -> int:
        """Nearest-rank 95th percentile."""
        waits = sorted(self._recent(now))
        if not waits:
            return 0
        return round(1000 * waits[math.ceil(0.95 * len(waits)) - 1])


class DrainMeter:
    """Slots freed per second (requests finishing at the engine) over the last `window_s`.

    Before a full window has passed, the rate is taken over the time since start,
    so a fresh runner does not report an inflated rate.
    """

    def __init__(self, window_s: float, started_at: float) -> None:
        self._window_s = window_s
        self._started_at = started_at
        self._done: deque[float] = deque(maxlen=MAX_SAMPLES)

    def record(self, at: float) -> None:
        self._done.append(at)

    def rate(self, now: float) -> float:
        while self._done and now - self._done[0] > self._window_s:
            self._done.popleft()
        span = min(self._window_s, now - self._started_at)
        if not self._done or span <= 0:
            return 0.0
        return len(self._done) / max(span, 1.0)


def retry_after_s(position: int, drain_per_s: float, fallback_s: float) -> int:
    """Seconds until `position` requests ahead have drained at the measured rate.

    1. With a measured rate, `ceil(position / rate)`.
    2. With none (nothing finished recently), the fallback (the queue timeout).
    3. Clamped to 1..3600: never zero, never absurd.
    """
    # 1, 2
    seconds = position / drain_per_s if drain_per_s > 0 else fallback_s
    # 3
    return min(max(math.ceil(seconds), 1), 3600)
