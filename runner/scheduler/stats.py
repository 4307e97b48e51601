"""Measurements the scheduler reports: the queue's snapshot and its recent waits.

Waits look back over a sliding window on the injected clock, so they describe recent
load, not the process's lifetime.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass, field

MAX_SAMPLES = 4096


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A snapshot for `/v1/capabilities` and metrics."""

    depth: int
    max_depth: int
    depth_by_priority: dict[str, int]
    avg_wait_ms: int
    p95_wait_ms: int
    in_flight: dict[str, int]
    # ms a new request (of a new tenant) would wait now, per model and priority
    forecast_by_model: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def forecast_wait_ms(self) -> dict[str, int]:
        """Per priority, the longest forecast over the models (0 with none known)."""
        return {
            band: max((f[band] for f in self.forecast_by_model.values()), default=0)
            for band in ("high", "normal", "low")
        }

    def capabilities(self) -> dict[str, object]:
        """The seed's `queue` section of `/v1/capabilities`, with the forecasts and
        `running`: the requests holding an engine slot now (`in_flight`, the scheduler's
        own count), a request whose client left included until its engine let it go."""
        return {
            "depth": self.depth,
            "running": sum(self.in_flight.values()),
            "maxDepth": self.max_depth,
            "avgWaitMs": self.avg_wait_ms,
            "p95WaitMs": self.p95_wait_ms,
            "forecastWaitMs": self.forecast_wait_ms,
            "forecastWaitMsByModel": self.forecast_by_model,
        }


class WaitWindow:
    """Queue waits of granted requests over the last `window_s` seconds.

    Keeps at most MAX_SAMPLES samples, their running sum and the waits in order, so the
    average a refusal reports costs O(1) and the p95 a scrape reads O(log n), however
    busy the window was (sorting a full window at each `/metrics` cost ~0.8 ms). Waits of
    zero (a request granted at once: the common case) are counted, not kept in order:
    recording one does not move the ordered list.
    """

    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()
        self._ordered: list[float] = []  # the waits of `_samples` above zero, ascending
        self._zeros = 0  # the waits of `_samples` that are zero
        self._sum = 0.0

    def record(self, at: float, wait_s: float) -> None:
        if len(self._samples) >= MAX_SAMPLES:
            self._drop_oldest()
        wait = max(wait_s, 0.0)
        self._samples.append((at, wait))
        if wait == 0.0:
            self._zeros += 1
            return
        insort(self._ordered, wait)
        self._sum += wait

    def _drop_oldest(self) -> None:
        wait = self._samples.popleft()[1]
        if wait == 0.0:
            self._zeros -= 1
            return
        del self._ordered[bisect_left(self._ordered, wait)]
        self._sum -= wait

    def _expire(self, now: float) -> None:
        samples = self._samples
        while samples and now - samples[0][0] > self._window_s:
            self._drop_oldest()
        if not samples:
            self._sum = 0.0  # no drift from float rounding once the window empties

    def avg_ms(self, now: float) -> int:
        self._expire(now)
        n = len(self._samples)
        return round(1000 * max(self._sum, 0.0) / n) if n else 0

    def p95_ms(self, now: float) -> int:
        """Nearest-rank 95th percentile of the waits in the window (the zeros first)."""
        self._expire(now)
        n = len(self._samples)
        if not n:
            return 0
        rank = math.ceil(0.95 * n) - 1
        return 0 if rank < self._zeros else round(1000 * self._ordered[rank - self._zeros])
