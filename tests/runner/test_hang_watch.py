"""The watch of the engines the runner started (runner/engines/hang_watch.py): which processes are
probed (pure) and what three unanswered probes do, driven against fakes without sleeps.
The real engines frozen with SIGSTOP: tests/runner/test_hang_contract.py."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest

from runner.engines.hang_watch import HangWatch, Running, hang_reason, probe_targets
from runner.engines.record import EngineRecord
from runner.scheduler.models import ModelState, ModelView

pytestmark = pytest.mark.timeout(10)


def _view(model: str, state: ModelState = ModelState.READY, unloading: bool = False) -> ModelView:
    return ModelView(
        model, state, 0, 1, 0, 0, 0.0, 0.0, False, 0, None, None, None, unloading=unloading
    )


class FakeProcess:
    def __init__(self) -> None:
        self.killed: list[str] = []

    def kill(self, cause: str) -> bool:
        self.killed.append(cause)
        return len(self.killed) == 1


def _running(
    model: str,
    process: FakeProcess,
    pid: int = 100,
    backend: str = "llama-server",
    ready: bool = True,
    serving: bool = True,
) -> Running:
    return Running(model, backend, f"http://127.0.0.1:{pid}", pid, process, ready, serving)


def test_probe_targets_ready_models_only() -> None:
    """Only an engine whose model is READY is probed: not while it loads, drains or
    unloads, sleeps or has failed."""
    states = {
        "ready": _view("ready"),
        "loading": _view("loading", ModelState.LOADING),
        "draining": _view("draining", ModelState.DRAINING),
        "unloading": _view("unloading", unloading=True),
        "asleep": _view("asleep", ModelState.SLEEPING),
        "failed": _view("failed", ModelState.FAILED),
    }
    running = [_running(m, FakeProcess(), pid=i) for i, m in enumerate(states)]
    [target] = probe_targets(running, states)
    assert target.models == ("ready",) and target.url == "http://127.0.0.1:0/health"


def test_probe_targets_not_a_process_that_is_not_ready_or_not_serving() -> None:
    """A process still starting or stopping (the supervisor's state), or one loading again
    or asleep in the pool, is not probed even if the scheduler still says READY."""
    views = {m: _view(m) for m in ("starting", "reloading")}
    running = [
        _running("starting", FakeProcess(), pid=1, ready=False),
        _running("reloading", FakeProcess(), pid=2, serving=False),
    ]
    assert probe_targets(running, views) == []


def test_probe_targets_one_per_process_while_any_model_on_it_is_ready() -> None:
    """ComfyUI's one server serves several models: probed once, on its own path, naming
    the READY models on it."""
    server = FakeProcess()
    views = {"a": _view("a"), "b": _view("b"), "c": _view("c", ModelState.LOADING)}
    running = [_running(m, server, pid=7, backend="comfyui") for m in views]
    [target] = probe_targets(running, views)
    assert target.models == ("a", "b")
    assert target.url == "http://127.0.0.1:7/system_stats"


class FakeProber:
    def __init__(self) -> None:
        self.answer: dict[str, bool] = {}
        self.asked: list[str] = []
        self.during: list[Callable[[], None]] = []  # run while the probe is out (a state change)

    async def answers(self, url: str) -> bool:
        self.asked.append(url)
        for change in self.during:
            change()
        return self.answer.get(url, False)

    async def aclose(self) -> None:
        return None


class Views:
    def __init__(self, views: dict[str, ModelView]) -> None:
        self.views = views

    def models(self) -> dict[str, ModelView]:
        return dict(self.views)


def _watch(
    running: list[Running], views: Views, prober: FakeProber
) -> tuple[HangWatch, list[tuple[str, str]]]:
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    def gather(_records: Mapping[str, EngineRecord]) -> list[Running]:
        return list(running)

    watch = HangWatch(
        {}, views, 0.5, misses=3, timeout_s=5.0, prober=prober, running=gather, clock=clock
    )
    hangs: list[tuple[str, str]] = []
    watch.on_hang = lambda model, backend: hangs.append((model, backend))
    return watch, hangs


async def test_hang_watch_three_missed_probes_kill_the_process_with_the_reason() -> None:
    """Two misses do nothing; the third kills the process (through its supervisor) with
    a reason naming the hang and the probes, and counts the hang once per model."""
    process = FakeProcess()
    watch, hangs = _watch([_running("m", process)], Views({"m": _view("m")}), FakeProber())
    await watch.poll()
    await watch.poll()
    assert process.killed == [] and hangs == []
    await watch.poll()
    reason = "hung: stopped answering /health (3 probes of 5 s missed); killed by the runner"
    assert process.killed == [reason] == [hang_reason("llama-server", 3, 5.0)]
    assert hangs == [("m", "llama-server")]


async def test_hang_watch_an_answer_in_between_keeps_the_engine() -> None:
    """A busy engine that answers one probe in three is never killed."""
    process = FakeProcess()
    prober = FakeProber()
    watch, hangs = _watch([_running("m", process)], Views({"m": _view("m")}), prober)
    for i in range(9):
        prober.answer = {"http://127.0.0.1:100/health": i % 3 == 2}
        await watch.poll()
    assert process.killed == [] and hangs == []


async def test_hang_watch_a_model_that_leaves_ready_while_probed_is_not_counted() -> None:
    """An unload begun while the probes were out: their misses count for nothing, and the
    engine, READY again, starts from 0."""
    process = FakeProcess()
    views = Views({"m": _view("m")})
    prober = FakeProber()
    watch, _ = _watch([_running("m", process)], views, prober)
    await watch.poll()
    await watch.poll()
    prober.during = [lambda: views.views.update(m=_view("m", unloading=True))]
    await watch.poll()
    prober.during = []
    views.views["m"] = _view("m")
    await watch.poll()
    await watch.poll()
    assert process.killed == []
    await watch.poll()
    assert len(process.killed) == 1


async def test_hang_watch_probes_every_engine_in_one_round() -> None:
    """Every READY engine is asked in each round, a hung one does not hide another."""
    a, b = FakeProcess(), FakeProcess()
    prober = FakeProber()
    prober.answer = {"http://127.0.0.1:2/health": True}
    running = [_running("a", a, pid=1), _running("b", b, pid=2)]
    watch, hangs = _watch(running, Views({"a": _view("a"), "b": _view("b")}), prober)
    for _ in range(3):
        await watch.poll()
    assert sorted(prober.asked) == sorted(
        ["http://127.0.0.1:1/health"] * 3 + ["http://127.0.0.1:2/health"] * 3
    )
    assert len(a.killed) == 1 and b.killed == [] and hangs == [("a", "llama-server")]
