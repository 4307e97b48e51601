"""The engine watch: engines' own figures and versions, read off the hot path
(runner/engines/engine_watch.py), against engines behind httpx mock transports."""

from __future__ import annotations

import httpx
from prometheus_client import CollectorRegistry, generate_latest

from adapters.base import Engine
from adapters.comfyui.engine import ComfyUIEngine
from adapters.comfyui.server import ComfyUIServer
from adapters.comfyui.workflows import MODEL_FREE_TEST
from adapters.http_client import EngineConnections
from adapters.vllm.engine import VllmEngine, VllmMetricsCollector
from runner.engines.engine_watch import EngineLoad, EngineWatch

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


def _vllm(handler: httpx.MockTransport, collector: VllmMetricsCollector) -> VllmEngine:
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


async def test_engine_watch_reads_vllm_metrics_and_version() -> None:
    """vLLM's /metrics become the model's figures, its families are re-exposed, its
    /version names the engine; an engine no longer served is forgotten everywhere."""
    collector = VllmMetricsCollector()
    engines: dict[str, Engine] = {"v": _vllm(httpx.MockTransport(_vllm_answers), collector)}
    watch = EngineWatch(engines, 1.0, collector)
    await watch.poll()
    assert watch.loads == {"v": EngineLoad(2048.0, 0.25, waiting=2, running=3)}
    assert watch.versions["vllm"] == "0.33.0"
    registry = CollectorRegistry()
    registry.register(collector)
    assert b'vllm:num_requests_waiting{engine="0",model_name="v"} 2.0' in generate_latest(registry)
    engines.clear()
    await watch.poll()
    assert watch.loads == {} and collector.engines() == []


async def test_engine_watch_engine_that_fails_keeps_no_figures() -> None:
    """An engine whose /metrics fails reads no figures (not stale ones)."""
    calls = {"n": 0}

    def flaky(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        return _vllm_answers(request) if calls["n"] <= 2 else httpx.Response(500)

    engines: dict[str, Engine] = {"v": _vllm(httpx.MockTransport(flaky), VllmMetricsCollector())}
    watch = EngineWatch(engines, 1.0)
    await watch.poll()
    assert "v" in watch.loads
    await watch.poll()
    assert watch.loads == {}


async def test_engine_watch_counts_a_comfyui_queue_once_per_server() -> None:
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
    engines: dict[str, Engine] = {
        "one": ComfyUIEngine("one", server, MODEL_FREE_TEST),
        "two": ComfyUIEngine("two", server, MODEL_FREE_TEST),
    }
    watch = EngineWatch(engines, 1.0)
    await watch.poll()
    assert watch.loads == {"one": EngineLoad(waiting=2, running=1), "two": EngineLoad()}
    assert watch.versions["comfyui"] == "0.3.64"
