"""How long a request holds its slot, learned from what the engine actually took (pure).

A request may say how much work it is (`AdmissionRequest.work`: for an image, megapixels
x sampler steps x images, `adapters/comfyui/image_costs.image_work`). The seconds a
request of a model took from its grant to its `ServeDone` are then fitted, over the
model's last completions, as `overhead + per_work x work` (least squares with an
intercept): ComfyUI takes a fixed time per prompt (loading, encoding, decoding, saving)
plus time per step and pixel, so a ratio through zero, fitted on small requests, would
make a large one last minutes (issue 41: 530 s forecast for a 17 s prompt).

- `WorkFit`: one model's fit, updated on every finish (`add`), read by `estimate_s`.
- `remaining_s`: what a request in flight has left, from the estimate, the time it has
  run and, when the engine reported it, its progress.

The fit is over completions only (never over time passing): it needs no clock; the
scheduler passes `now` where time matters (`remaining_s`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

FIT_SAMPLES = 32
"""Completions per model the fit is taken over."""
MIN_PROGRESS = 0.05
"""Progress below this says too little to extrapolate from."""


@dataclass(frozen=True, slots=True)
class Line:
    """`overhead_s + per_work_s x work`."""

    overhead_s: float
    per_work_s: float

    def at(self, work: float) -> float:
        return self.overhead_s + self.per_work_s * max(work, 0.0)


class WorkFit:
    """One model's seconds per request as a line in its work, over its last completions."""

    def __init__(self, samples: int = FIT_SAMPLES) -> None:
        self._done: deque[tuple[float, float]] = deque(maxlen=samples)  # (work, seconds)
        self._line: Line | None = None

    def add(self, work: float, seconds: float) -> None:
        """One finished request: its work and the seconds it held its slot."""
        self._done.append((max(work, 0.0), max(seconds, 0.0)))
        self._line = fit_line(self._done)

    def estimate_s(self, work: float) -> float | None:
        """Seconds a request of `work` is expected to take; None before any completion."""
        return None if self._line is None else self._line.at(work)

    @property
    def line(self) -> Line | None:
        return self._line


def fit_line(points: deque[tuple[float, float]] | list[tuple[float, float]]) -> Line | None:
    """The least-squares line through `(work, seconds)` points (pure).

    1. No point: None.
    2. The works all (nearly) alike: no slope can be told; every request is forecast at
       the mean time. A ratio through zero would forecast a request 250 times the work
       of the small ones 250 times as long (issue 41: 530 s for a 17 s prompt, fitted on
       the warm-up's); the mean is short for it instead, until one such finishes, and the
       prompt running now is corrected by its progress (`remaining_s`).
    3. Otherwise ordinary least squares, then held to what time can be: a negative slope
       (noise) gives the mean time; a negative overhead becomes 0, with the slope of the
       least squares through the origin.
    """
    n = len(points)
    if n == 0:  # 1
        return None
    mean_w = sum(w for w, _ in points) / n
    mean_s = sum(s for _, s in points) / n
    flat = Line(mean_s, 0.0)
    var_w = sum((w - mean_w) ** 2 for w, _ in points)
    if var_w <= 1e-12 * max(mean_w * mean_w, 1e-12) * n:  # 2
        return flat
    slope = sum((w - mean_w) * (s - mean_s) for w, s in points) / var_w  # 3
    if slope < 0:
        return flat
    overhead = mean_s - slope * mean_w
    if overhead < 0:
        squares = sum(w * w for w, _ in points)
        return Line(0.0, sum(w * s for w, s in points) / squares)
    return Line(overhead, slope)


def remaining_s(estimate_s: float, ran_s: float, progress: float | None) -> float:
    """What a request in flight has left (pure).

    1. The engine reported progress `p` (0..1, at least MIN_PROGRESS): the part not done,
       `1 - p`, of the whole run, the whole being the longer of the estimate and `ran / p`
       (a run slower than its model's fit goes on at its own pace).
    2. Otherwise the estimate less what it has run, at least 0 (overdue: any moment).
    """
    ran = max(ran_s, 0.0)
    if progress is not None and progress >= MIN_PROGRESS:  # 1
        done = min(progress, 1.0)
        return (1.0 - done) * max(estimate_s, ran / done)
    return max(estimate_s - ran, 0.0)  # 2
