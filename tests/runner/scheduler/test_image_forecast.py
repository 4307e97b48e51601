"""The wait forecast for requests that state their work (images, issue 41): each model's
seconds fitted as a line in its work on every finish (`work_fit.py`), the request running
now corrected by its time run and progress, a shared server's requests each timed at
their own model's speed, and `Retry-After` for `queue_full` from the same figure. Driven
on the scheduler core with a hand-moved clock."""

from __future__ import annotations

import math

import pytest

from runner.scheduler.config import ModelPolicy, SchedulerConfig
from runner.scheduler.events import RequestArrived
from runner.scheduler.grants import AdmissionRequest
from runner.scheduler.work_fit import Line, WorkFit, fit_line, remaining_s
from tests.runner.scheduler.fakes import Driver

pytestmark = pytest.mark.timeout(30)

COMFY = "comfyui:http://127.0.0.1:8188"


def driver(models: tuple[str, ...], max_queue_depth: int = 64) -> Driver:
    """Ready models on one ComfyUI server (one slot group, one slot)."""
    policies = {m: ModelPolicy(0, 1, slot_group=COMFY) for m in models}
    config = SchedulerConfig(
        models=policies, unlisted_ready=False, low_aging_s=None, max_queue_depth=max_queue_depth
    )
    d = Driver(config)
    for model, policy in policies.items():
        d.load(model, policy)
        d.ready(model, 0, 1)
    return d


class Images:
    """Image requests of a stated work (megapixel-steps) arriving at the driver."""

    def __init__(self, d: Driver) -> None:
        self.d = d
        self.next_id = 1000

    def arrive(self, model: str, work: float) -> int:
        self.next_id += 1
        request = AdmissionRequest(f"img{self.next_id}", model, "t", "normal", 1, 256, work=work)
        self.d.core.handle(RequestArrived(self.next_id, request, self.d.now))
        return self.next_id

    def serve(self, model: str, work: float, seconds: float) -> None:
        """One request served alone, taking `seconds`."""
        ticket = self.arrive(model, work)
        self.d.now += seconds
        self.d.done(ticket)

    def forecast_ms(self, model: str) -> int:
        return self.d.core.stats(self.d.now).forecast_by_model[model]["normal"]


def test_work_fit_learns_a_fixed_part_and_a_part_per_work() -> None:
    """Seconds 2 + 0.5 x work over three sizes: the line is found, so a request 20 times
    the work is 12 s, not 20 times the mean."""
    fit = WorkFit()
    for work in (1.0, 4.0, 8.0):
        fit.add(work, 2.0 + 0.5 * work)
    assert fit.line is not None
    assert fit.line.overhead_s == pytest.approx(2.0)
    assert fit.estimate_s(20.0) == pytest.approx(12.0)


def test_work_fit_alike_works_give_the_mean_never_a_ratio() -> None:
    """Only small requests seen (the warm-up's 64 px, 1 s each): a request 5000 times
    their work is forecast at their mean, not 5000 s (issue 41: 530 s for a 17 s prompt);
    a falling line (noise) also gives the mean."""
    assert fit_line([(0.004, 1.0)] * 5) == Line(1.0, 0.0)
    assert fit_line([(1.0, 3.0), (2.0, 1.0)]) == Line(2.0, 0.0)


def test_remaining_follows_progress_past_the_estimate() -> None:
    """A prompt 5 s in with an estimate of 1 s: without progress, any moment; with its
    sampler 25% done, three times what it ran (it goes on at its own pace)."""
    assert remaining_s(1.0, 5.0, None) == 0.0
    assert remaining_s(1.0, 5.0, 0.25) == pytest.approx(15.0)
    assert remaining_s(10.0, 2.0, 0.5) == pytest.approx(5.0)


def test_image_forecast_for_a_running_large_prompt_is_what_it_has_left() -> None:
    """Fitted on a small and a mid request (1.5 s + 0.5 s per unit of work): with a
    22 s request 5 s in and nothing queued, a new request waits 17 s; with its progress
    reported slower than that (10% after 5 s), 45 s."""
    d = driver(("img",))
    images = Images(d)
    images.serve("img", 1.0, 2.0)
    images.serve("img", 5.0, 4.0)
    large = images.arrive("img", 41.0)
    d.tick(5.0)
    assert images.forecast_ms("img") == pytest.approx(17_000, abs=1)
    d.core.service.progress(large, 0.1)
    assert images.forecast_ms("img") == pytest.approx(45_000, abs=1)


def test_image_forecast_on_a_shared_server_times_each_model_at_its_speed() -> None:
    """Two models on one ComfyUI: `big` takes 10 s a request, `small` 0.5 s. With a `big`
    request 1 s in and a `small` one queued, `small`'s forecast is big's 9 s left plus the
    queued 0.5 s (it was timed at small's own speed: 8 ms read against 16.8 s waited)."""
    d = driver(("big", "small"))
    images = Images(d)
    images.serve("big", 1.0, 10.0)
    images.serve("small", 1.0, 0.5)
    images.arrive("big", 1.0)
    images.arrive("small", 1.0)
    d.tick(1.0)
    assert images.forecast_ms("small") == pytest.approx(9_500, abs=1)
    assert images.forecast_ms("big") == pytest.approx(9_500, abs=1)


def test_image_queue_full_retry_after_is_the_forecast_figure() -> None:
    """A full queue behind a 22 s prompt 5 s in: Retry-After is when it ends, 17 s (the
    forecast's figure for what it has left), not its model's mean (3 s) nor a whole
    queue drained."""
    d = driver(("img",), max_queue_depth=1)
    images = Images(d)
    images.serve("img", 1.0, 2.0)
    images.serve("img", 5.0, 4.0)
    images.arrive("img", 41.0)
    images.arrive("img", 1.0)
    d.tick(5.0)
    refused = images.arrive("img", 1.0)
    ticket, error = d.effects.rejected[-1]
    assert ticket == refused
    assert int(error.headers["Retry-After"]) == math.ceil(17.0)
