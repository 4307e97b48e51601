"""`pick`: the choice of a runner from the runners' states (pure, no network)."""

from __future__ import annotations

from typing import Any

import pytest

from client.pick import pick, rendezvous
from client.state import RunnerState, observe_capabilities, observe_failure, observe_refusal
from tests.client.docs import caps

CACHE = {"cache-control": "max-age=5"}


def up(url: str, doc: dict[str, Any], now: float = 0.0) -> RunnerState:
    return observe_capabilities(RunnerState(url), 200, CACHE, doc, now)


def test_pick_loaded_before_loading_before_available() -> None:
    """A runner with the model loaded wins over one loading it, which wins over one that
    only offers it, whatever their queues."""
    runners = [
        up("http://c", caps("c", available=("m",))),
        up("http://b", caps("b", loading=(("m", 1.0),))),
        up("http://a", caps("a", loaded=("m",), depth=3, p95=100)),
    ]
    choice = pick("m", runners, 1.0)
    assert choice is not None
    assert [c.url for c in choice.ranking] == ["http://a", "http://b", "http://c"]
    assert "has it loaded; http://b has it loading" in choice.reason


def test_pick_full_queue_goes_last() -> None:
    """A runner whose queue is full (it would refuse now) ranks after one loading the model."""
    runners = [
        up("http://full", caps("f", loaded=("m",), depth=2, max_depth=2)),
        up("http://loading", caps("l", loading=(("m", 5.0),))),
    ]
    choice = pick("m", runners, 0.0)
    assert choice is not None and choice.url == "http://loading"
    assert "http://full is full" in choice.reason


def test_pick_by_forecast_wait_then_kv_then_memory() -> None:
    """Among loaded runners: shorter forecast wait, then less KV use, then more free memory."""
    busy = up("http://busy", caps("b", loaded=("m",), depth=4, p95=500))
    kv = up("http://kv", caps("k", loaded=("m",), kv=0.9))
    small = up("http://small", caps("s", loaded=("m",), free_mb=100))
    best = up("http://best", caps("x", loaded=("m",), free_mb=1500))
    choice = pick("m", [busy, kv, small, best], 0.0)
    assert choice is not None
    assert [c.url for c in choice.ranking] == [
        "http://best",
        "http://small",
        "http://kv",
        "http://busy",
    ]
    assert choice.ranking[-1].forecast_wait_ms == 2000
    assert "more free memory (1500 MB; http://small 100 MB)" in choice.reason


def test_pick_uses_runner_forecast_per_priority() -> None:
    """`queue.forecastWaitMs` for the request's priority replaces depth x p95 when present."""
    a = up("http://a", caps("a", loaded=("m",), depth=9, p95=900, forecast={"high": 0}))
    b = up("http://b", caps("b", loaded=("m",), forecast={"high": 800, "normal": 0}))
    high = pick("m", [a, b], 0.0, priority="high")
    normal = pick("m", [a, b], 0.0, priority="normal")
    assert high is not None and high.url == "http://a"
    assert normal is not None and normal.url == "http://b"


def test_pick_counts_retry_after_as_wait() -> None:
    """A runner that sent Retry-After ranks by what is left of it, until it has passed."""
    a = observe_refusal(up("http://a", caps("a", loaded=("m",))), 5.0, now=10.0)
    b = up("http://b", caps("b", loaded=("m",), depth=1, p95=1000))
    during = pick("m", [a, b], 12.0)
    after = pick("m", [a, b], 15.5)
    assert during is not None and during.url == "http://b"
    assert during.ranking[1].forecast_wait_ms == 3000
    assert after is not None and after.url == "http://a"


def test_pick_leaves_out_runners_that_cannot_serve() -> None:
    """Unreachable, starting, unknown runners and runners without the model (or where it
    failed) are left out, each with its reason; nothing left: None."""
    gone = observe_failure(up("http://gone", caps("g", loaded=("m",))), "ConnectError", 7.0)
    starting = observe_capabilities(RunnerState("http://s"), 503, {}, caps(health="starting"), 0)
    other = up("http://other", caps("o", loaded=("x",)))
    failed = up("http://failed", caps("f", failed=("m",)))
    never = RunnerState("http://never")
    runners = [gone, starting, other, failed, never]
    assert pick("m", runners, 8.0) is None
    ok = up("http://ok", caps("ok", loaded=("m",)))
    choice = pick("m", [*runners, ok], 8.0)
    assert choice is not None and choice.url == "http://ok"
    assert choice.excluded == {
        "http://gone": "unreachable (ConnectError)",
        "http://s": "starting (runner is starting)",
        "http://other": "does not offer the model",
        "http://failed": "the model failed there",
        "http://never": "unknown",
    }
    assert gone.view is not None and gone.age(8.0) == 8.0  # the last good view is kept


@pytest.mark.parametrize("model", ["m1", "m2", "m3", "m4"])
def test_pick_tie_break_is_deterministic_and_sticky(model: str) -> None:
    """Equal runners: the same model always goes to the same runner (rendezvous hash),
    whatever order the runners are listed in."""
    urls = ["http://a", "http://b", "http://c"]
    runners = [up(u, caps(u, loaded=(model,))) for u in urls]
    first = pick(model, runners, 0.0)
    again = pick(model, list(reversed(runners)), 0.0)
    assert first is not None and again is not None and first.url == again.url
    assert first.url == max(urls, key=lambda u: rendezvous(model, u))
    assert "tie-break" in first.reason
