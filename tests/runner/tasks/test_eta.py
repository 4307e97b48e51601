"""Load-time prediction: the fitted speed, the estimator's memory, and the running ETA."""

from __future__ import annotations

import statistics

import pytest

from runner.tasks.eta import (
    DEFAULT_SPEED,
    SYNTHETIC_PROGRESS_CAP,
    EtaEstimator,
    LoadSample,
    LoadSpeed,
    download_progress,
    eta_remaining,
    fit_load_speed,
    synthetic_progress,
)

DEFAULT = LoadSpeed(start_s=5.0, bandwidth_mb_s=1000.0)


def samples(*pairs: tuple[float, float]) -> list[LoadSample]:
    return [LoadSample(size, seconds) for size, seconds in pairs]


def test_eta_no_samples_uses_default() -> None:
    """Without measurements, 8000 MB at 1000 MB/s after a 5 s start predicts 13 s."""
    speed = fit_load_speed([], DEFAULT)
    assert speed == DEFAULT
    assert speed.predict(8000) == 13.0


def test_eta_exact_line_is_recovered() -> None:
    """Loads on one line (6 s + 6 s per GB) give start 6 s and 166.7 MB/s back exactly."""
    speed = fit_load_speed(samples((1000, 12), (4000, 30), (8000, 54)), DEFAULT)
    assert speed.start_s == pytest.approx(6.0)
    assert speed.bandwidth_mb_s == pytest.approx(1000 / 6)
    assert speed.samples == 3
    assert speed.predict(16000) == pytest.approx(102.0)


def test_eta_one_outlier_barely_moves_the_fit() -> None:
    """One load far slower than the rest (a cold disk) leaves the prediction near the line."""
    clean = [(1000, 12), (2000, 18), (4000, 30), (6000, 42), (8000, 54)]
    with_outlier = [*clean, (3000, 120)]
    speed = fit_load_speed(samples(*with_outlier), DEFAULT)
    assert speed.predict(16000) == pytest.approx(102.0, rel=0.02)
    # Least squares on the same loads would be off by more than 15 %.
    slope, start = statistics.linear_regression(*zip(*with_outlier, strict=True))
    assert abs(start + slope * 16000 - 102.0) > 15


def test_eta_single_sample_keeps_default_start() -> None:
    """One 8000 MB load of 45 s: start stays the default 5 s, bandwidth 8000/40 = 200 MB/s."""
    speed = fit_load_speed(samples((8000, 45)), DEFAULT)
    assert speed.start_s == 5.0
    assert speed.bandwidth_mb_s == pytest.approx(200.0)
    assert speed.predict(8000) == pytest.approx(45.0)


def test_eta_fast_single_sample_caps_start() -> None:
    """A 4 s load (shorter than the 5 s default start) halves into start 2 s and 2 s of transfer."""
    speed = fit_load_speed(samples((100, 4)), DEFAULT)
    assert speed.start_s == 2.0
    assert speed.bandwidth_mb_s == pytest.approx(50.0)


def test_eta_same_size_samples_use_their_median() -> None:
    """Repeated loads of one size predict that size's median time."""
    speed = fit_load_speed(samples((4000, 20), (4000, 25), (4000, 90)), DEFAULT)
    assert speed.predict(4000) == pytest.approx(25.0)


def test_eta_bigger_loads_faster_falls_back_to_proportional() -> None:
    """A negative slope (noise) never yields a negative or infinite prediction."""
    speed = fit_load_speed(samples((1000, 30), (8000, 20)), DEFAULT)
    assert speed.start_s == 5.0
    assert speed.bandwidth_mb_s > 0
    assert speed.predict(4000) > speed.start_s


def test_eta_negative_intercept_is_clamped_to_zero() -> None:
    """Loads that extrapolate to a negative start get start 0, never below."""
    speed = fit_load_speed(samples((1000, 1), (2000, 3), (3000, 5)), DEFAULT)
    assert speed.start_s == 0.0
    assert speed.bandwidth_mb_s == pytest.approx(500.0)


def test_eta_invalid_samples_and_speeds_are_refused() -> None:
    """Zero or negative sizes, durations and bandwidths raise ValueError."""
    for size, seconds in ((0, 1), (1, 0), (-5, 1), (float("nan"), 1)):
        with pytest.raises(ValueError):
            LoadSample(size, seconds)
    with pytest.raises(ValueError):
        LoadSpeed(start_s=1, bandwidth_mb_s=0)
    with pytest.raises(ValueError):
        LoadSpeed(start_s=-1, bandwidth_mb_s=1)


def test_eta_estimator_keeps_backends_apart() -> None:
    """Samples of one backend do not change another backend's prediction."""
    est = EtaEstimator(DEFAULT)
    est.record("vllm", 1000, 40)
    est.record("vllm", 8000, 75)
    assert est.predict("vllm", 8000) == pytest.approx(75.0)
    assert est.predict("llama.cpp", 8000) == DEFAULT.predict(8000)


def test_eta_estimator_per_key_defaults() -> None:
    """A key with a configured default uses it until measured; others use the global one."""
    download = LoadSpeed(start_s=1.0, bandwidth_mb_s=100.0)
    est = EtaEstimator(DEFAULT, defaults={"download": download})
    assert est.predict("download", 1000) == 11.0
    assert est.speed("vllm") == DEFAULT
    assert EtaEstimator().speed("x") == DEFAULT_SPEED


def test_eta_estimator_window_forgets_old_loads() -> None:
    """Only the last `window` loads count: a faster disk shows after `window` new loads."""
    est = EtaEstimator(DEFAULT, window=3)
    for size in (1000, 2000, 3000):
        est.record("vllm", size, size / 100)  # 100 MB/s, no start
    for size in (1000, 2000, 3000):
        est.record("vllm", size, size / 1000)  # the new disk: 1000 MB/s
    assert len(est.samples("vllm")) == 3
    assert est.speed("vllm").bandwidth_mb_s == pytest.approx(1000.0)


def test_eta_estimator_record_returns_new_fit() -> None:
    """record() answers the refreshed speed, counting the new sample."""
    est = EtaEstimator(DEFAULT)
    assert est.record("vllm", 2000, 12).samples == 1
    assert est.record("vllm", 4000, 22).samples == 2


def test_eta_synthetic_progress_is_elapsed_over_predicted_capped() -> None:
    """30 s into a 60 s prediction reads 0.5; past the prediction it stalls at 0.95."""
    assert synthetic_progress(30, 60) == 0.5
    assert synthetic_progress(57, 60) == pytest.approx(0.95)
    assert synthetic_progress(600, 60) == 0.95
    assert synthetic_progress(-3, 60) == 0.0
    assert synthetic_progress(5, 0) == 0.95


def test_eta_remaining_without_progress_follows_prediction() -> None:
    """With no engine progress, the ETA is the prediction minus what has elapsed."""
    assert eta_remaining(100, 0, None) == 100
    assert eta_remaining(100, 40, None) == 60
    assert eta_remaining(100, 94.5, None) == 5.5
    assert eta_remaining(1.3, 0.25, None) == 1.1  # tenths: a second-long load is not 0 or 2


def test_eta_remaining_overrun_never_reads_zero() -> None:
    """A load past its prediction still reports a few seconds, growing with the overrun."""
    assert eta_remaining(100, 150, None) == 7.5
    assert eta_remaining(100, 300, None) == 15
    assert eta_remaining(10, 10_000, None) >= 1


def test_eta_remaining_blends_reported_progress() -> None:
    """Half done after 10 s of a 100 s prediction: halfway between 10 s (pace) and 90 s."""
    assert eta_remaining(100, 10, 0.5) == 50
    assert eta_remaining(100, 10, 0.9) == 10  # 0.9 * (10 * 0.1 / 0.9) + 0.1 * 90


def test_eta_remaining_done_is_zero_and_running_is_at_least_a_tenth() -> None:
    """progress 1.0 reads 0; anything not done reads at least 0.1 second."""
    assert eta_remaining(100, 10, 1.0) == 0
    assert eta_remaining(100, 100, 0.999) == 0.1
    assert eta_remaining(0, 0, None) == 0.1


def test_download_progress_unknown_until_bytes_arrive() -> None:
    """Nothing measured yet: progress 0 and no eta (the task keeps the one it has)."""
    assert download_progress(None, 3.0, 1.0) == (0.0, None)
    assert download_progress(0.0, 3.0, 1.0) == (0.0, None)


def test_download_progress_extrapolates_the_pace_and_adds_the_engine_start() -> None:
    """A quarter in 2 s: 6 s of download left plus the predicted 2 s start; progress is
    the task's share of time so far, 2 of 10 s."""
    progress, eta = download_progress(0.25, 2.0, 2.0)
    assert eta == 8.0
    assert progress == pytest.approx(0.2)


def test_download_progress_done_download_waits_for_the_engine_and_stays_capped() -> None:
    """A finished download reads capped progress and a nonzero eta until the engine is up."""
    progress, eta = download_progress(1.0, 100.0, 0.0)
    assert eta == 0.1  # never 0 before the task completes
    assert progress == SYNTHETIC_PROGRESS_CAP
