"""Which runner should serve a model now (pure): `pick(model, runners, now)`.

The choice only advises (the runner that owns its queue still decides to serve or refuse);
a refusal comes back as a 429/503 with Retry-After, which the pool feeds into the next
choice. Every candidate's figures and every runner left out are kept in the `Choice`,
so `choice.reason` can say in words why this runner, and tests can read the ranking.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from client.capabilities import Capabilities
from client.state import Reach, RunnerState

TIERS = {"loaded": 0, "loading": 1, "available": 2}
FORECAST_BUCKET_MS = 100
"""Forecasts closer than this are equal: the views are up to 5 s old, finer is noise."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A runner that could serve the model, with the figures it was ranked by."""

    url: str
    runner_id: str
    model_state: str  # loaded | loading | available
    full: bool
    forecast_wait_ms: int
    kv_utilization: float
    free_memory_mb: int
    tie_break: int

    @property
    def key(self) -> tuple[bool, int, int, float, int, int]:
        """Smaller is better: room, tier, forecast (bucketed), KV use, free memory, hash."""
        return (
            self.full,
            TIERS[self.model_state],
            self.forecast_wait_ms // FORECAST_BUCKET_MS,
            self.kv_utilization,
            -self.free_memory_mb,
            -self.tie_break,
        )

    def describe(self) -> str:
        return (
            f"{self.url} ({self.model_state}{', queue full' if self.full else ''}, "
            f"forecast wait {self.forecast_wait_ms} ms, KV {self.kv_utilization:.0%}, "
            f"{self.free_memory_mb} MB free)"
        )


@dataclass(frozen=True, slots=True)
class Choice:
    model: str
    runner: Candidate
    ranking: tuple[Candidate, ...]
    """Every candidate, best first (`ranking[0]` is `runner`)."""
    excluded: dict[str, str] = field(default_factory=dict)
    """Runners left out, with why."""

    @property
    def url(self) -> str:
        return self.runner.url

    @property
    def reason(self) -> str:
        """Why this runner, in one sentence: what set it apart from the runner-up."""
        best = self.runner
        if len(self.ranking) == 1:
            why = "the only runner that can serve it"
        else:
            why = _decider(best, self.ranking[1])
        text = f"{self.model} on {best.describe()}: {why}"
        if self.excluded:
            text += "; left out: " + "; ".join(f"{u} {w}" for u, w in self.excluded.items())
        return text


def pick(
    model: str,
    runners: Sequence[RunnerState],
    now: float,
    *,
    priority: str = "normal",
    exclude: Collection[str] = (),
) -> Choice | None:
    """The best runner for `model`, or None when no runner can take it.

    1. Leave out runners in `exclude`, runners that are not `up` (starting, stopping,
       unavailable, unreachable, never polled) and runners that do not offer the model
       (a model that failed there is not offered).
    2. A runner whose queue is full (it would refuse now with 503) goes after every
       runner with room.
    3. Then by the model's state there: loaded before loading before available.
    4. Then by forecast wait for `priority`: the runner's own forecast when it reports
       one, else queue depth x p95 wait; for a loading model plus its load's eta; at
       least what remains of the last Retry-After it sent. In 100 ms buckets.
    5. Then lower KV cache utilization.
    6. Then more free memory.
    7. Ties: rendezvous hashing of (model, url), so a model keeps going to the same
       runner (its prefix cache stays warm) while different models spread out.
    """
    excluded: dict[str, str] = {}
    candidates: list[Candidate] = []
    for state in runners:
        why = _left_out(state, model, exclude)  # 1
        if why is not None:
            excluded[state.url] = why
            continue
        assert state.view is not None
        candidates.append(_candidate(state, state.view, model, priority, now))
    if not candidates:
        return None
    ranking = tuple(sorted(candidates, key=lambda c: c.key))  # 2-7
    return Choice(model, ranking[0], ranking, excluded)


def left_out(
    model: str, runners: Sequence[RunnerState], exclude: Collection[str] = ()
) -> dict[str, str]:
    """Why each runner that `pick` would leave out is left out (step 1)."""
    reasons = {s.url: _left_out(s, model, exclude) for s in runners}
    return {url: why for url, why in reasons.items() if why is not None}


def _left_out(state: RunnerState, model: str, exclude: Collection[str]) -> str | None:
    if state.url in exclude:
        return "already tried"
    if state.reach is not Reach.UP or state.view is None:
        return state.reach.value + (f" ({state.error})" if state.error else "")
    where = state.view.state_of(model)
    if where is None:
        return "does not offer the model"
    if where == "failed":
        return "the model failed there"
    return None


def _candidate(
    state: RunnerState, view: Capabilities, model: str, priority: str, now: float
) -> Candidate:
    where = view.state_of(model)
    assert where in TIERS
    forecast = view.queue.forecast_ms(priority)
    if where == "loading":
        forecast += round(1000 * (view.loading_eta(model) or 0.0))
    forecast = max(forecast, round(1000 * state.retry_after_s(now)))
    return Candidate(
        url=state.url,
        runner_id=view.runner_id,
        model_state=where,
        full=view.queue.full,
        forecast_wait_ms=forecast,
        kv_utilization=view.kv_cache_utilization,
        free_memory_mb=view.gpu_memory_free_mb,
        tie_break=rendezvous(model, state.url),
    )


def rendezvous(model: str, url: str) -> int:
    """A stable pseudo-random weight of (model, runner): highest weight wins ties."""
    digest = hashlib.blake2b(f"{model}\0{url}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _decider(best: Candidate, other: Candidate) -> str:
    """The first ranking step at which `best` beat the runner-up `other`, in words."""
    if best.full != other.full:
        return f"has room in its queue; {other.url} is full"
    if best.model_state != other.model_state:
        return f"has it {best.model_state}; {other.url} has it {other.model_state}"
    if best.key[2] != other.key[2]:
        return (
            f"forecasts a shorter wait ({best.forecast_wait_ms} ms; "
            f"{other.url} {other.forecast_wait_ms} ms)"
        )
    if best.kv_utilization != other.kv_utilization:
        return (
            f"uses less KV cache ({best.kv_utilization:.0%}; "
            f"{other.url} {other.kv_utilization:.0%})"
        )
    if best.free_memory_mb != other.free_memory_mb:
        return (
            f"has more free memory ({best.free_memory_mb} MB; "
            f"{other.url} {other.free_memory_mb} MB)"
        )
    return f"wins the tie-break with {other.url} (rendezvous hash of model and URL)"
