"""How long a model load will take, from how long earlier loads took. Pure: no I/O, no clock.

A load costs a fixed start (process start, CUDA context, graph capture) plus its size
over a bandwidth (disk or network to GPU)::

    seconds = start_s + size_mb / bandwidth_mb_s

Finished loads are recorded per key as (size_mb, seconds); the key is the backend
(`llama.cpp`, `vllm`) or any other kind of transfer (`download`), since each has its
own speed. The fit is Theil-Sen: the slope is the median of the slopes between every
pair of recorded loads of different sizes, the start is the median of what each load
left over. Why not least squares: one load that ran on a cold page cache or a busy disk
pulls a least-squares line a long way, while the medians ignore up to about three in
ten such outliers; with at most `window` samples (20) the ~190 pairs cost nothing.
Without measurements the configured default speed answers.

While a load runs, `eta_remaining` blends the prediction with the measured progress,
and `synthetic_progress` stands in for progress an engine does not report; while its
weights download, `download_progress` reads the bytes done so far.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MIN_SIZE_GAP_MB = 1.0
"""Two loads closer in size than this say nothing about the bandwidth (no pair slope)."""

SYNTHETIC_PROGRESS_CAP = 0.95
"""A load with no progress reports never reads above this until it is done."""


@dataclass(frozen=True, slots=True)
class LoadSpeed:
    """A fitted (or configured) load speed; `samples` = how many loads back it (0: default)."""

    start_s: float
    bandwidth_mb_s: float
    samples: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start_s) and self.start_s >= 0):
            raise ValueError(f"start_s must be >= 0, not {self.start_s!r}")
        if not (math.isfinite(self.bandwidth_mb_s) and self.bandwidth_mb_s > 0):
            raise ValueError(f"bandwidth_mb_s must be > 0, not {self.bandwidth_mb_s!r}")

    def predict(self, size_mb: float) -> float:
        """Seconds to load `size_mb`: start plus size over bandwidth."""
        return self.start_s + max(size_mb, 0.0) / self.bandwidth_mb_s


DEFAULT_SPEED = LoadSpeed(start_s=10.0, bandwidth_mb_s=500.0)
"""A guess (a local NVMe disk to one GPU, with an engine's start-up); the first measured
load replaces it. Operators with other hardware configure their own."""


@dataclass(frozen=True, slots=True)
class LoadSample:
    """One finished load: how big it was and how long it took."""

    size_mb: float
    seconds: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.size_mb) and self.size_mb > 0):
            raise ValueError(f"size_mb must be > 0, not {self.size_mb!r}")
        if not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"seconds must be > 0, not {self.seconds!r}")


def fit_load_speed(samples: Sequence[LoadSample], default: LoadSpeed) -> LoadSpeed:
    """The load speed these samples show (Theil-Sen), or `default` without any.

    1. No samples -> `default`.
    2. Slope (seconds per MB) = median of the pair slopes between samples at least
       `MIN_SIZE_GAP_MB` apart in size.
    3. No such pair (one sample, or all one size), or a slope <= 0 (bigger loads were
       not slower: noise) -> keep the default start, capped at half the median load
       time so a fast load never predicts negative transfer time, and take the slope
       as the median of (seconds - start) / size.
    4. Otherwise start = median of (seconds - slope * size), at least 0.
    5. Bandwidth = 1 / slope.
    """
    if not samples:  # 1
        return default
    pair_slopes = [  # 2
        (b.seconds - a.seconds) / (b.size_mb - a.size_mb)
        for i, a in enumerate(samples)
        for b in samples[i + 1 :]
        if abs(b.size_mb - a.size_mb) >= MIN_SIZE_GAP_MB
    ]
    slope = statistics.median(pair_slopes) if pair_slopes else 0.0
    if slope <= 0:  # 3
        start = min(default.start_s, statistics.median(s.seconds for s in samples) / 2)
        slope = statistics.median((s.seconds - start) / s.size_mb for s in samples)
    else:  # 4
        start = max(0.0, statistics.median(s.seconds - slope * s.size_mb for s in samples))
    return LoadSpeed(start_s=start, bandwidth_mb_s=1.0 / slope, samples=len(samples))  # 5


class EtaEstimator:
    """Recent finished loads per key (backend), and the speed they show.

    Keeps the last `window` samples per key (old hardware states age out); each key
    falls back to `defaults[key]`, then to `default`, until it has a sample.
    """

    def __init__(
        self,
        default: LoadSpeed = DEFAULT_SPEED,
        *,
        defaults: Mapping[str, LoadSpeed] | None = None,
        window: int = 20,
    ) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self._default = default
        self._defaults = dict(defaults or {})
        self._window = window
        self._samples: dict[str, deque[LoadSample]] = {}
        self._fitted: dict[str, LoadSpeed] = {}

    def record(self, key: str, size_mb: float, seconds: float) -> LoadSpeed:
        """Add one finished load of `size_mb` that took `seconds`; return the new fit."""
        sample = LoadSample(size_mb, seconds)
        self._samples.setdefault(key, deque(maxlen=self._window)).append(sample)
        self._fitted.pop(key, None)
        return self.speed(key)

    def samples(self, key: str) -> tuple[LoadSample, ...]:
        return tuple(self._samples.get(key, ()))

    def speed(self, key: str) -> LoadSpeed:
        """The fitted speed for `key` (refit only after a new sample)."""
        fitted = self._fitted.get(key)
        if fitted is None:
            fallback = self._defaults.get(key, self._default)
            fitted = fit_load_speed(self.samples(key), fallback)
            self._fitted[key] = fitted
        return fitted

    def predict(self, key: str, size_mb: float) -> float:
        """Seconds a load of `size_mb` through `key` should take."""
        return self.speed(key).predict(size_mb)


def synthetic_progress(
    elapsed_s: float, predicted_total_s: float, cap: float = SYNTHETIC_PROGRESS_CAP
) -> float:
    """Progress for a load whose engine reports none: elapsed over predicted, capped.

    1. No usable prediction (<= 0) -> `cap` (it is under way; how far is unknown).
    2. Otherwise elapsed / predicted, within 0..`cap`: a slow load stalls at `cap`
       rather than claiming 100 % before the engine says it is ready.
    """
    if predicted_total_s <= 0:  # 1
        return cap
    return min(max(elapsed_s / predicted_total_s, 0.0), cap)  # 2


def eta_remaining(predicted_total_s: float, elapsed_s: float, progress: float | None) -> float:
    """Seconds left for a running load, to a tenth of a second (loads of a small model take
    a second or two: whole seconds would be wrong by a third before the load even starts).

    1. Done (`progress` >= 1) -> 0.
    2. No reported progress (None) -> `synthetic_progress(elapsed, predicted)`.
    3. From the prediction: predicted - elapsed (at least 0).
    4. From the progress p > 0: elapsed * (1 - p) / p, the pace so far extrapolated.
    5. Blend them, weighting the measured pace by p: early, a few percent over a few
       seconds extrapolates wildly; late, the pace is the better witness (and it keeps
       a load that overran its prediction from reading 0).
    6. Not done, so at least 0.1 s; rounded up to the tenth.
    """
    if progress is not None and progress >= 1.0:  # 1
        return 0.0
    elapsed = max(elapsed_s, 0.0)
    p = synthetic_progress(elapsed, predicted_total_s) if progress is None else progress  # 2
    p = min(max(p, 0.0), 1.0)
    by_prediction = max(predicted_total_s - elapsed, 0.0)  # 3
    by_pace = elapsed * (1.0 - p) / p if p > 0 else by_prediction  # 4
    remaining = p * by_pace + (1.0 - p) * by_prediction  # 5
    return max(0.1, math.ceil(10 * remaining - 1e-9) / 10)  # 6 (epsilon: float noise)


def download_progress(
    fraction: float | None, elapsed_s: float, load_s: float
) -> tuple[float, float | None]:
    """A downloading load task's (progress, eta): the whole task on one clock, so the bar
    goes on smoothly into the engine's start.

    1. No bytes measured yet (`fraction` None or 0): progress 0, eta unknown (None: the
       task keeps the one it has).
    2. Download left at the pace so far: elapsed * (1 - f) / f; eta = that plus the
       predicted engine start `load_s`, in tenths of a second (at least 0.1).
    3. Progress = elapsed / (elapsed + eta), never above `SYNTHETIC_PROGRESS_CAP`.
    """
    if not fraction or fraction <= 0:  # 1
        return 0.0, None
    f = min(fraction, 1.0)
    elapsed = max(elapsed_s, 0.0)
    remaining = elapsed * (1.0 - f) / f + max(load_s, 0.0)  # 2
    eta = max(0.1, math.ceil(10 * remaining - 1e-9) / 10)
    progress = elapsed / (elapsed + eta) if elapsed > 0 else 0.0  # 3
    return min(progress, SYNTHETIC_PROGRESS_CAP), eta
