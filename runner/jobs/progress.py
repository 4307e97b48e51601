"""What a job's work sees of the job (`ProgressReporter`), and when progress is worth a write.

Work reports progress as often as it likes (every decoded segment, every
sampler step); `should_write` decides which reports reach the store, so a
fast job costs at most about `1 / min_step` writes plus one per `min_interval_s`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from runner.jobs.record import Progress


class ProgressReporter(Protocol):
    """Handed to a job's work; both methods may be called any number of times."""

    async def running(self) -> None:
        """The work got its slot (left the queue, model loaded or loading): QUEUED -> RUNNING."""
        ...

    async def report(self, done: float, total: float | None = None) -> None:
        """`done` of `total` units so far (speech: audio seconds). Implies `running()`."""
        ...


_EPSILON = 1e-9  # 0.06 - 0.01 is 0.04999... in floating point; it is a 5% step


@dataclass(frozen=True, slots=True)
class Throttle:
    """Limits on progress writes: a write is due after `min_interval_s` or a `min_step` move."""

    min_interval_s: float = 0.5
    min_step: float = 0.05


def should_write(
    last: Progress | None,
    last_at: float | None,
    new: Progress,
    now: float,
    throttle: Throttle,
) -> bool:
    """Whether the `new` progress reported at `now` goes to the store.

    1. Nothing written yet: write.
    2. Nothing changed since the last write: skip.
    3. The work is complete (done reached total): write.
    4. The fraction moved by at least `min_step` since the last write (or a total appeared
       or vanished): write.
    5. At least `min_interval_s` since the last write: write.
    6. Otherwise skip.
    """
    if last is None or last_at is None:  # 1.
        return True
    if new == last:  # 2.
        return False
    fraction, last_fraction = new.fraction, last.fraction
    if fraction is not None and fraction >= 1.0:  # 3.
        return True
    if fraction is not None and last_fraction is not None:  # 4.
        if abs(fraction - last_fraction) >= throttle.min_step - _EPSILON:
            return True
    elif fraction != last_fraction:
        return True
    return now - last_at >= throttle.min_interval_s  # 5. / 6.
