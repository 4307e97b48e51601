"""The one engine watch (runner/engines/watch.py): which engines are probed (pure), what
three unanswered probes do, and the engines' own figures and versions, driven against
fakes and httpx mock transports without sleeps. The real engines frozen with SIGSTOP:
tests/runner/engines/test_hang_contract.py; attached engines lost and back:
tests/runner/engines/test_watch_attached.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from adapters.comfyui.engine import ComfyUIEngine
from adapters.comfyui.kind import launched as comfy_launched
from adapters.comfyui.server import ComfyUIServer
from adapters.comfyui.workflows import MODEL_FREE_TEST
from adapters.engine_families import EngineFamiliesCollector
from adapters.http_client import EngineConnections
from adapters.launched import EngineLoad, Launched
from adapters.vllm.engine import VllmEngine
from adapters.vllm.kind import launched as vllm_launched
from runner.engines.kinds import EngineKinds
from runner.engines.record import EngineRecord
from runner.engines.specs import ModelSpecs
from runner.engines.watch import EngineWatch, Running, hang_reason, probe_targets
from runner.floor.models_file import ModelSpec
from runner.scheduler.config import ModelPolicy
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
    probe: str = "/health",
    ready: bool = True,
    serving: bool = True,
) -> Running:
    url = f"http://127.0.0.1:{pid}"
    return Running(model, backend, url, probe, pid, process, ready, serving)


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
    """ComfyUI's one server serves several models: probed once, on its kind's path, naming
    the READY models on it."""
    server = FakeProcess()
    views = {"a": _view("a"), "b": _view("b"), "c": _view("c", ModelState.LOADING)}
    running = [_running(m, server, 7, "comfyui", "/system_stats") for m in views]
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
    """The scheduler as the watch sees it: its views, and the loads it is asked for."""

    def __init__(self, views: dict[str, ModelView]) -> None:
        self.views = views
        self.loads: list[str] = []

    def models(self) -> dict[str, ModelView]:
        return dict(self.views)

    def request_load(self, model: str, policy: ModelPolicy, evict_first: str | None = None) -> None:
        self.loads.append(model)


@dataclass
class FakePool:
    """The pool as the watch sees it: its ready engines, their records and its catalog."""

    models: list[ModelSpec] = field(default_factory=list)
    ready: dict[str, Launched] = field(default_factory=dict)
    kinds: EngineKinds = field(default_factory=EngineKinds)
    lost: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.specs = ModelSpecs(self.models, self.kinds, lambda _gpus: None)
        self.records = {m.id: EngineRecord(m) for m in self.models}

    def attached_lost(self, model: str, reason: str) -> None:
        self.lost.append((model, reason))


def _watch(
    running: list[Running], views: Views, prober: FakeProber, pool: FakePool | None = None
) -> tuple[EngineWatch, list[tuple[str, str]]]:
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    hangs: list[tuple[str, str]] = []
    watch = EngineWatch(
        pool or FakePool(),
        views,
        0.5,
        misses=3,
        timeout_s=5.0,
        prober=prober,
        on_hang=lambda model, backend: hangs.append((model, backend)),
        running=lambda: list(running),
        clock=clock,
    )
    return watch, hangs


async def test_watch_three_missed_probes_kill_the_process_with_the_reason() -> None:
    """Two misses do nothing; the third kills the process (through its supervisor) with
    a reason naming the hang and the probes, and counts the hang once per model."""
    process = FakeProcess()
    watch, hangs = _watch([_running("m", process)], Views({"m": _view("m")}), FakeProber())
    await watch.poll()
    await watch.poll()
    assert process.killed == [] and hangs == []
    await watch.poll()
    reason = "hung: stopped answering /health (3 probes of 5 s missed); killed by the runner"
    assert process.killed == [reason] == [hang_reason("/health", 3, 5.0)]
    assert hangs == [("m", "llama-server")]


async def test_watch_an_answer_in_between_keeps_the_engine() -> None:
    """A busy engine that answers one probe in three is never killed."""
    process = FakeProcess()
    prober = FakeProber()
    watch, hangs = _watch([_running("m", process)], Views({"m": _view("m")}), prober)
    for i in range(9):
        prober.answer = {"http://127.0.0.1:100/health": i % 3 == 2}
        await watch.poll()
    assert process.killed == [] and hangs == []


async def test_watch_a_model_that_leaves_ready_while_probed_is_not_counted() -> None:
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


async def test_watch_probes_every_engine_in_one_round() -> None:
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


async def test_watch_an_attached_engine_lost_then_back_is_asked_for_again() -> None:
    """An engine attached by URL (no process of ours) that misses three probes is lost to
    the pool, not killed; once failed and answering again, the scheduler is asked for its
    load."""
    spec = ModelSpec(id="echo", backend="openai", url="http://127.0.0.1:9/")
    pool = FakePool([spec])
    views = Views({"echo": _view("echo")})
    prober = FakeProber()
    running = Running(
        "echo", "openai", "http://127.0.0.1:9/", "/v1/models", "echo", None, True, True
    )
    watch, hangs = _watch([running], views, prober, pool)
    for _ in range(3):
        await watch.poll()
    assert [m for m, _ in pool.lost] == ["echo"] and hangs == []
    assert "stopped answering (3 probes missed)" in pool.lost[0][1]
    views.views["echo"] = _view("echo", ModelState.FAILED)
    prober.answer = {"http://127.0.0.1:9/v1/models": True}
    await watch.poll()
    assert views.loads == ["echo"]


METRICS = """\
# HELP vllm:num_requests_running Running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="v"} 3.0
# HELP vllm:num_requests_waiting Waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="v"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="v"} 0.25
"""


def _vllm(handler: httpx.MockTransport, collector: EngineFamiliesCollector) -> VllmEngine:
    control = httpx.AsyncClient(base_url="http://vllm", transport=handler)
    engine = VllmEngine(
        "v", "http://127.0.0.1:1", 4, EngineConnections("http://127.0.0.1:1", 1, 1), control, None
    )
    engine.metrics_sink = collector
    engine.kv_size_mb = 2048.0
    return engine


def _vllm_answers(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/metrics":
        return httpx.Response(200, text=METRICS)
    if request.url.path == "/version":
        return httpx.Response(200, json={"version": "0.33.0"})
    return httpx.Response(404)


def _figures_watch(
    ready: dict[str, Launched], models: list[ModelSpec], collector: EngineFamiliesCollector
) -> EngineWatch:
    pool = FakePool(models, ready)
    return EngineWatch(pool, Views({}), 1.0, families=collector, running=list)


VLLM = ModelSpec(id="v", backend="vllm", url="http://127.0.0.1:1")


async def test_watch_reads_vllm_metrics_and_version() -> None:
    """vLLM's /metrics become the model's figures, its families are re-exposed, its
    /version names the engine; an engine no longer served is forgotten everywhere."""
    collector = EngineFamiliesCollector()
    ready = {"v": vllm_launched(_vllm(httpx.MockTransport(_vllm_answers), collector))}
    watch = _figures_watch(ready, [VLLM], collector)
    await watch.poll()
    assert watch.loads == {"v": EngineLoad(2048.0, 0.25, waiting=2, running=3)}
    assert watch.versions["vllm"] == "0.33.0"
    registry = CollectorRegistry()
    registry.register(collector)
    assert b'vllm:num_requests_waiting{engine="0",model_name="v"} 2.0' in generate_latest(registry)
    ready.clear()
    await watch.poll()
    assert watch.loads == {} and collector.engines() == []


async def test_watch_engine_that_fails_keeps_no_figures() -> None:
    """An engine whose /metrics fails reads no figures (not stale ones)."""
    calls = {"n": 0}

    def flaky(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        return _vllm_answers(request) if calls["n"] <= 2 else httpx.Response(500)

    collector = EngineFamiliesCollector()
    ready = {"v": vllm_launched(_vllm(httpx.MockTransport(flaky), collector))}
    watch = _figures_watch(ready, [VLLM], collector)
    await watch.poll()
    assert "v" in watch.loads
    await watch.poll()
    assert watch.loads == {}


async def test_watch_counts_a_comfyui_queue_once_per_server() -> None:
    """Two models on one ComfyUI: its running and pending prompts are counted once."""

    def comfy(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/queue":
            item = lambda pid: [0, pid, {}, {}, []]  # noqa: E731
            return httpx.Response(
                200, json={"queue_running": [item("a")], "queue_pending": [item("b"), item("c")]}
            )
        if request.url.path == "/system_stats":
            return httpx.Response(200, json={"system": {"comfyui_version": "0.3.64"}})
        return httpx.Response(404)

    http = httpx.AsyncClient(base_url="http://127.0.0.1:2", transport=httpx.MockTransport(comfy))
    server = ComfyUIServer(http)
    ready = {m: comfy_launched(ComfyUIEngine(m, server, MODEL_FREE_TEST)) for m in ("one", "two")}
    models = [ModelSpec(id=m, backend="comfyui", url="http://127.0.0.1:2") for m in ready]
    watch = _figures_watch(ready, models, EngineFamiliesCollector())
    await watch.poll()
    assert watch.loads == {"one": EngineLoad(waiting=2, running=1), "two": EngineLoad()}
    assert watch.versions["comfyui"] == "0.3.64"
