"""Start-up's preloads, followed while the runner already answers.

The runner opens its port before it preloads (runner/http/app.py): `/health` answers 503
`starting` and capabilities 503 until every `preload` model has ended (ready or failed).
This record says how far that is: which models are still to load, the predicted time of
each (the pool's `EtaEstimator`, as a governed load's task has it), and when the current
one started. From it come the `Retry-After` of every 503 while starting, and the
`progress` / `eta` of the preloading models in capabilities' `models.loading`.

Preloads run one after another, so the time left is what the current load has left
(`eta_remaining`, which keeps a load that overran its prediction from reading 0) plus
the predictions of those not started yet.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from runner.floor.models_file import ModelSpec
from runner.scheduler import ModelNotice, ModelState
from runner.tasks import LoadTask
from runner.tasks.eta import eta_remaining

log = logging.getLogger("quorum.runtime")


@dataclass
class Preloads:
    """The preloads still ahead of a starting runner; time is read from `clock` (epoch s,
    the load tasks' clock)."""

    runner_id: str
    clock: Callable[[], float]
    _planned: dict[str, float] = field(default_factory=dict)  # model -> predicted s, in order
    _current: LoadTask | None = None

    async def run(
        self,
        specs: Sequence[ModelSpec],
        load: Callable[[ModelSpec], Awaitable[ModelNotice]],
        predict: Callable[[ModelSpec], float],
    ) -> None:
        """Attach URL engines and load `preload` models (`specs`), one after another
        (`load`: through the scheduler's memory policy, `LoadManager.preload`); a failure is
        recorded (the model reads failed), not fatal. `predict(spec)`: its load time."""
        for spec in specs:  # attaching an engine somebody else runs is one probe: ~0 s
            self.plan(spec.id, 0.0 if spec.attached else predict(spec))
        for spec in specs:
            self.begin(spec.id)
            try:
                notice = await load(spec)
            finally:
                self.end()
            if notice.refused is not None or notice.view.state is not ModelState.READY:
                why = notice.refused or notice.view.reason
                log.error("preload of %s failed: %s", spec.id, why)

    def plan(self, model: str, predicted_s: float) -> None:
        """`model` will be preloaded; its load should take `predicted_s`."""
        self._planned[model] = max(predicted_s, 0.0)

    def begin(self, model: str) -> None:
        """The load of `model` starts now."""
        predicted = self._planned.pop(model, 0.0)
        now = self.clock()
        task = LoadTask.new(model, self.runner_id, now=now, eta=round(predicted, 1))
        self._current = task.start_loading(eta=task.eta, now=now)

    def end(self) -> None:
        """The current load ended (ready or failed)."""
        self._current = None

    def loading(self) -> dict[str, LoadTask]:
        """The model preloading now, as a load task as of now (capabilities' `loading`)."""
        if self._current is None:
            return {}
        return {self._current.model_id: self._current.as_of(self.clock())}

    def eta_s(self) -> float:
        """Seconds until every preload should have ended: what the current load has left
        plus the predictions of those still to start."""
        now = self.clock()
        current = self._current
        left = 0.0
        if current is not None:
            elapsed = current.elapsed(now)
            left = eta_remaining(current.eta or 0.0, elapsed, None)
        return left + sum(self._planned.values())

    def retry_after_s(self) -> int:
        """The `Retry-After` while starting: the time left in whole seconds, at least 1."""
        return max(1, math.ceil(self.eta_s()))
