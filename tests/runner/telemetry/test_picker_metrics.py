"""The endpoint picker's gauges (runner/telemetry/picker_metrics.py): vLLM's names, one typed sample
each, from the runner's own state, served on the picker's path (/metrics/picker, off
/metrics, or merged into it with PICKER_METRICS_PATH=/metrics); pure figures first, then
real runners (a stand-in llama-server with two slots, and the fake vLLM whose own series
they replace)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import httpx
import pytest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from adapters.launched import EngineLoad
from adapters.vllm.metrics import parse_families
from runner.engines.kinds import EngineKinds
from runner.floor.models_file import ModelSpec
from runner.floor.settings import PICKER_PATH
from runner.scheduler import ModelState
from runner.scheduler.models import ModelView
from runner.telemetry.metrics import METRICS_PATH, Metrics
from runner.telemetry.picker_metrics import (
    NAMES,
    AdapterInfo,
    KvCache,
    PickerCollector,
    PickerView,
    cache_config,
    families,
    kv_usage,
    picker_view,
)
from runner.telemetry.snapshot import ModelMemory, ResourceSnapshot
from tests.fixtures.fake_vllm import BIN as VLLM_BIN
from tests.fixtures.fake_vllm import process_env as vllm_env
from tests.support.fleet import caps
from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, fixture_bin, start_runner

pytestmark = pytest.mark.timeout(120)

TWO_SLOTS = f"""models:
  - id: m
    backend: llama-server
    path: /dev/null
    bin: {fixture_bin("llama-server-paced-long")}
    vram_mb: 64
    parallel: 2
    preload: true
  - id: spare
    backend: llama-server
    path: /dev/null
    bin: {fixture_bin("llama-server-ok")}
    vram_mb: 64
    autoload: true
"""


def _view(model: str, state: ModelState, in_flight: int = 0) -> ModelView:
    return ModelView(model, state, 64, 1, in_flight, 0, 0.0, 0.0, False, 0, None, None, None)


def _spec(model: str, backend: str, autoload: bool = False) -> ModelSpec:
    return ModelSpec.model_validate(
        {"id": model, "backend": backend, "path": "/dev/null", "autoload": autoload}
    )


def _info(block_size: str, blocks: str) -> Sample:
    labels = {"engine": "0", "block_size": block_size, "num_gpu_blocks": blocks}
    return Sample("vllm:cache_config_info", labels, 1.0)


def test_kv_usage_weights_by_cache_size() -> None:
    """Usages are weighted by cache size when every size is known, averaged otherwise, 0
    with no KV cache, and kept within 0..1."""
    assert kv_usage([]) == 0.0
    assert kv_usage([KvCache(1.0, 300), KvCache(0.0, 100)]) == 0.75
    assert kv_usage([KvCache(1.0, 300), KvCache(0.0, 0)]) == 0.5
    assert kv_usage([KvCache(1.5, 10)]) == 1.0


def test_cache_config_sums_blocks_of_one_block_size() -> None:
    """Blocks are summed over engines sharing a block size; different block sizes or no
    numbers (vLLM's "None" before profiling) give no figure."""
    assert cache_config([_info("16", "100"), _info("16", "50")]) == (16, 150)
    assert cache_config([_info("16", "100"), _info("32", "50")]) is None
    assert cache_config([_info("16", "None")]) is None
    assert cache_config([]) is None


def test_picker_view_reads_queue_flight_adapters_and_caches() -> None:
    """Waiting is the queue, running the requests in flight; loaded adapters run, adapters
    asked for (requests queued) or being loaded wait, and the runner holds the loaded and
    loading ones; models are not adapters; KV comes from vLLM's own figures and
    llama-server's snapshot, not from others."""
    models = {
        "a": _view("a", ModelState.READY, in_flight=2),
        "b": _view("b", ModelState.LOADING),
        "v": _view("v", ModelState.READY, in_flight=1),
        "w": _view("w", ModelState.ABSENT),
        "x": _view("x", ModelState.ABSENT),
    }
    specs = {
        "a": _spec("a", "llama-server"),
        "b": _spec("b", "llama-server"),
        "v": _spec("v", "vllm"),
        "w": _spec("w", "faster-whisper", autoload=True),
        "x": _spec("x", "llama-server"),
    }
    snapshot = ResourceSnapshot(models=(ModelMemory("a", 400, 100, 300, 1.0),))
    loads = {"v": EngineLoad(kv_cache_mb=100, kv_cache_utilization=0.0)}
    kinds = EngineKinds()
    reports_kv = lambda spec: kinds.of(spec).traits.reports_kv  # noqa: E731
    adapters = [
        AdapterInfo("a:one", loaded=True, waiting=0, loading=False),
        AdapterInfo("a:two", loaded=True, waiting=2, loading=False),
        AdapterInfo("v:new", loaded=False, waiting=0, loading=True),
        AdapterInfo("x:off", loaded=False, waiting=0, loading=False),  # base not running
    ]
    samples = [_info("16", "64")]
    view = picker_view(models, 6, specs, snapshot, loads, samples, reports_kv, adapters)
    assert view == PickerView(6, 3, 0.75, (16, 64), ("a:one", "a:two"), ("a:two", "v:new"), 3)
    assert picker_view(models, 6, specs, snapshot, loads, []).running_adapters == ()


def test_families_are_typed_single_samples() -> None:
    """Each name is one gauge sample; the LoRA info carries the adapter lists
    comma-separated and the time it was read; cache config is left out when no engine
    says."""
    view = PickerView(6, 2, 0.5, None, ("a", "b"), ("c",), 3)
    by_name: dict[str, Metric] = {f.name: f for f in families(view, 1234.5)}
    assert list(by_name) == list(NAMES)
    assert all(f.type == "gauge" for f in by_name.values())
    assert [s.value for s in by_name["vllm:num_requests_waiting"].samples] == [6]
    assert by_name["vllm:cache_config_info"].samples == []
    (lora,) = by_name["vllm:lora_requests_info"].samples
    assert lora.value == 1234.5
    assert lora.labels == {
        "max_lora": "3",
        "running_lora_adapters": "a,b",
        "waiting_lora_adapters": "c",
    }


ENGINE_TEXT = """# HELP vllm:prefix_cache_queries_total Prefix cache queries, in tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="v"} 10.0
# HELP vllm:num_requests_running Requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="v"} 1.0
"""


def _served(picker_path: str) -> Metrics:
    """A runner's metrics with a vLLM engine's last scrape and the picker's gauges, routed
    as PICKER_METRICS_PATH=`picker_path` routes them."""
    metrics = Metrics()
    metrics.vllm.update("v", parse_families(ENGINE_TEXT))
    metrics.vllm.shadow(NAMES)
    view = PickerView(6, 2, 0.5, (16, 64), ("v",), (), 1)
    metrics.picker_registry.register(PickerCollector(lambda: view, clock=lambda: 1234.5))
    metrics.route(picker_path)
    metrics.count_request("v", "t", 200)
    return metrics


def _families(text: bytes) -> dict[str, Metric]:
    return {f.name: f for f in text_string_to_metric_families(text.decode())}


def test_metrics_picker_family_on_its_own_path_by_default() -> None:
    """By default /metrics carries no `vllm:*` name; /metrics/picker carries the picker's
    five typed gauges and vLLM's other series, and nothing of the runner's own."""
    metrics = _served(PICKER_PATH)
    assert list(metrics.paths) == [METRICS_PATH, PICKER_PATH]
    own = metrics.paths[METRICS_PATH].render()
    assert b"vllm:" not in own and b"quorum_requests_total" in own
    picker = _families(metrics.paths[PICKER_PATH].render())
    assert [picker[name].type for name in NAMES] == ["gauge"] * len(NAMES)
    assert [s.value for s in picker["vllm:num_requests_running"].samples] == [2]
    assert picker["vllm:prefix_cache_queries"].samples[0].labels["model_name"] == "v"
    assert not any(name.startswith("quorum_") for name in picker)


def test_metrics_picker_path_at_metrics_merges_the_family() -> None:
    """PICKER_METRICS_PATH=/metrics: /metrics is the only path and carries the runner's own
    series and then the picker's family (typed gauges, vLLM's series), each name once."""
    metrics = _served(METRICS_PATH)
    assert list(metrics.paths) == [METRICS_PATH]
    text = metrics.render()
    found = _families(text)
    assert [found[name].type for name in NAMES] == ["gauge"] * len(NAMES)
    assert "vllm:prefix_cache_queries" in found and "quorum_requests" in found
    assert text.count(b"# TYPE vllm:num_requests_running gauge") == 1
    assert text.index(b"quorum_requests_total") < text.index(b"vllm:num_requests_running")


def gauges(r: RunnerProcess, path: str = PICKER_PATH) -> dict[str, list[Sample]]:
    """The samples of every family `path` declares a gauge (`# TYPE ... gauge`)."""
    text = httpx.get(r.url + path, timeout=5).text
    return {f.name: f.samples for f in text_string_to_metric_families(text) if f.type == "gauge"}


def _value(r: RunnerProcess, name: str) -> float:
    (sample,) = gauges(r)[name]
    return sample.value


@pytest.fixture(scope="module")
def two_slots() -> Iterator[RunnerProcess]:
    """`m` (two slots) loaded, `spare` loading on a request; the busy test, last, kills it."""
    with start_runner(models_file=TWO_SLOTS, env={"MAX_QUEUE_DEPTH": "16"}) as r:
        eventually(lambda: [m["id"] for m in caps(r)["models"]["loaded"]] == ["m"], timeout=30)
        yield r


def test_picker_path_parses_with_the_typed_gauges(two_slots: RunnerProcess) -> None:
    """GET /metrics/picker parses as the Prometheus text format and declares each of the
    picker's five names a gauge, with one sample each but `cache_config_info` (no paged
    cache here); /metrics carries none of them."""
    r = two_slots
    answer = httpx.get(r.url + PICKER_PATH, timeout=5)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=")
    found = {f.name: f for f in text_string_to_metric_families(answer.text)}
    assert [found[name].type for name in NAMES] == ["gauge"] * len(NAMES)
    assert [len(found[name].samples) for name in NAMES] == [1, 1, 1, 0, 1]
    assert set(NAMES).isdisjoint(gauges(r, "/metrics"))


def test_metrics_picker_gauges_with_two_slots_busy_and_six_queued(
    two_slots: RunnerProcess,
) -> None:
    """With both slots of `m` streaming and 6 requests queued, the picker's endpoint
    (/metrics/picker) says `vllm:num_requests_running 2` and `vllm:num_requests_waiting 6`
    as typed gauges, and `vllm:lora_requests_info` names no adapter (the models are not
    adapters)."""
    r = two_slots
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with ExitStack() as stack:
        client = stack.enter_context(httpx.Client(timeout=60))
        pool = stack.enter_context(ThreadPoolExecutor(6))
        stack.callback(r.proc.kill)  # first out: the queued requests end with the runner
        held = []  # the streams' chunk iterators: dropping one would hang up at once
        for _ in range(2):
            stream = stack.enter_context(
                client.stream("POST", r.url + "/v1/chat/completions", json={**chat, "stream": True})
            )
            assert stream.status_code == 200
            held.append(stream.iter_raw())
            next(held[-1])
        for _ in range(6):
            pool.submit(httpx.post, r.url + "/v1/chat/completions", json=chat, timeout=60)
        eventually(lambda: _value(r, "vllm:num_requests_waiting") == 6)
        found = gauges(r)
        assert [s.value for s in found["vllm:num_requests_running"]] == [2]
        assert [s.value for s in found["vllm:num_requests_waiting"]] == [6]
        (usage,) = found["vllm:kv_cache_usage_perc"]
        assert 0.0 <= usage.value <= 1.0
        (lora,) = found["vllm:lora_requests_info"]
        assert lora.labels["running_lora_adapters"] == ""
        assert lora.labels["waiting_lora_adapters"] == ""
        assert lora.labels["max_lora"] == "0"
        assert lora.value > 1.7e9  # a Unix time: the picker keeps the newest
        assert found["vllm:cache_config_info"] == []  # llama-server has no paged blocks
        assert "vllm:" not in httpx.get(r.url + "/metrics", timeout=5).text


def test_picker_metrics_path_setting_puts_the_family_back_into_metrics() -> None:
    """PICKER_METRICS_PATH=/metrics (a stock picker that reads /metrics): /metrics carries
    the picker's typed gauges beside the runner's own series; /metrics/picker is no path."""
    with start_runner(models_file=TWO_SLOTS, env={"PICKER_METRICS_PATH": "/metrics"}) as r:
        eventually(lambda: [m["id"] for m in caps(r)["models"]["loaded"]] == ["m"], timeout=30)
        text = httpx.get(r.url + "/metrics", timeout=5).text
        found = {f.name: f for f in text_string_to_metric_families(text)}
        assert [found[name].type for name in NAMES] == ["gauge"] * len(NAMES)
        (lora,) = found["vllm:lora_requests_info"].samples
        assert lora.labels["max_lora"] == "0"
        assert "quorum_requests_in_flight" in found and "vllm_queue_depth" in found
        assert httpx.get(r.url + PICKER_PATH, timeout=5).status_code == 404


VLLM_MODELS = f"""models:
  - {{id: v, backend: vllm, hf: org/v, parallel: 1, preload: true, bin: '{VLLM_BIN}'}}
"""


def test_metrics_vllm_series_replaced_by_the_runners_aggregate() -> None:
    """Fronting vLLM, each picker name carries one sample on /metrics/picker, the runner's
    (no `model_name` label), while vLLM's other series stay there (none on /metrics);
    cache_config_info is the engine's paged cache."""
    env = {
        **vllm_env(),
        "RUNNER_MEMORY_MB": "81920",
        "VLLM_GPU_MEMORY_UTILIZATION": "0.3",
        "ENGINE_STATS_INTERVAL_S": "0.2",
    }
    with start_runner(models_file=VLLM_MODELS, env=env, ready_timeout=60) as r:

        def scraped() -> bool:
            text = httpx.get(r.url + PICKER_PATH, timeout=5).text
            return "vllm:prefix_cache_queries_total" in text

        eventually(scraped, timeout=30)
        eventually(lambda: len(gauges(r)["vllm:cache_config_info"]) == 1)
        assert "vllm:" not in httpx.get(r.url + "/metrics", timeout=5).text
        text = httpx.get(r.url + PICKER_PATH, timeout=5).text
        found = {f.name: f for f in text_string_to_metric_families(text)}
        for name in NAMES:
            assert found[name].type == "gauge"
            assert len(found[name].samples) == 1, (name, found[name].samples)
            assert "model_name" not in found[name].samples[0].labels
        (config,) = found["vllm:cache_config_info"].samples
        assert config.labels == {"block_size": "16", "num_gpu_blocks": "2048"}
        assert found["vllm:lora_requests_info"].samples[0].labels["running_lora_adapters"] == ""
        assert found["vllm:prefix_cache_queries"].samples[0].labels["model_name"] == "v"
