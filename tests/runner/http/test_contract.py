"""One contract, three engines: llama-server, vLLM and ComfyUI runners answer the seed's API
the same way (capabilities shape, governed load/unload, limits, queue, metrics).

Each kind is a real runner subprocess that starts its engines itself: the llama-server
stand-ins of tests/fixtures/bin/, the fake `vllm` executable, and the fake ComfyUI run as
`COMFYUI_PATH/main.py`. Every runner has model `m` (preloaded, one slot) and model `n`
(not loaded), MAX_QUEUE_DEPTH=1 and tenant `limited` at 2 requests a minute.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.fake_vllm import BIN as VLLM_BIN
from tests.support.engines import (
    CHECKPOINT,
    GOVERNED,
    caps,
    comfyui_root,
    load_and_wait,
    loaded,
    unload,
)
from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, fixture_bin, start_runner

pytestmark = pytest.mark.timeout(120)

SEED_TOP = {
    "runnerType",
    "runnerId",
    "models",
    "resources",
    "queue",
    "capabilities",
    "health",
}
SEED_LOADED = {"id", "quantization", "contextLength", "loadedAt", "gpuMemoryMB"}
SEED_LOADING = {"id", "progress", "eta"}
SEED_RESOURCES = {
    "gpuIds",
    "gpuMemoryTotalMB",
    "gpuMemoryUsedMB",
    "gpuMemoryFreeMB",
    "gpuUtilization",
    "kvCacheSizeMB",
    "kvCacheUtilization",
}
SEED_QUEUE = {"depth", "maxDepth", "avgWaitMs", "p95WaitMs"}
SEED_FLAGS = {
    "streaming",
    "prefixCaching",
    "multiTenant",
    "visionInput",
    "audioInput",
    "functionCalling",
}
LONG = " ".join(f"w{i}" for i in range(40))


@dataclass(frozen=True)
class Kind:
    """One runner kind: its models file, settings, requests and what it claims."""

    backend: str
    runner_type: str  # a regular expression
    features: dict[str, bool]
    fake_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def models_file(self, root: Path) -> str:
        if self.backend == "llama-server":
            return (
                "models:\n"
                f"  - {{id: m, backend: llama-server, path: /dev/null, vram_mb: 64, parallel: 1,"
                f" preload: true, bin: '{fixture_bin('llama-server-paced')}'}}\n"
                f"  - {{id: n, backend: llama-server, path: /dev/null, vram_mb: 64,"
                f" bin: '{fixture_bin('llama-server-ok')}'}}\n"
            )
        if self.backend == "vllm":
            return (
                "models:\n"
                f"  - {{id: m, backend: vllm, hf: org/m, parallel: 1, preload: true,"
                f" bin: '{VLLM_BIN}'}}\n"
                f"  - {{id: n, backend: vllm, hf: org/n, parallel: 1, bin: '{VLLM_BIN}'}}\n"
            )
        return (
            "models:\n"
            f"  - {{id: m, backend: comfyui, checkpoint: {CHECKPOINT}, preload: true}}\n"
            "  - {id: n, backend: comfyui, workflow: model-free-test}\n"
        )

    def settings(self, root: Path) -> dict[str, str]:
        env = {
            **GOVERNED,
            "MAX_QUEUE_DEPTH": "1",
            "TENANT_RATE_LIMIT_limited": "2req/min",
            # declared, so /metrics labels it by name (undeclared ids read `_other`)
            "TENANT_RATE_LIMIT_metered": "unlimited",
            "ENGINE_STATS_INTERVAL_S": "0.2",
            **self.env,
        }
        if self.backend == "comfyui":
            env["COMFYUI_PATH"] = str(comfyui_root(root / "comfyui", *self.fake_args))
        return env

    def request(self, model: str, *, slow: bool = False) -> tuple[str, dict[str, Any]]:
        """(path, body) of one inference request; `slow` holds the engine ~3 s."""
        if self.backend == "comfyui":
            prompt = "[fake:slow] a kite" if slow else "a kite"
            return "/v1/images/generations", {"model": model, "prompt": prompt, "size": "64x64"}
        body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": LONG}]}
        if slow:
            body.update(stream=True, max_tokens=30)
        return "/v1/chat/completions", body

    def check_answer(self, response: httpx.Response) -> None:
        assert response.status_code == 200, response.text
        if self.backend == "comfyui":
            assert response.json()["data"][0]["b64_json"]
        elif response.headers["content-type"].startswith("text/event-stream"):
            assert b"[DONE]" in response.content
        else:
            assert response.json()["choices"][0]["message"]["content"]


LLM = {"streaming": True, "prefixCaching": True, "visionInput": False, "audioInput": False}
KINDS = {
    "llama-server": Kind(
        "llama-server", r"llama-server-\d+\.\d+\.\d+", {**LLM, "functionCalling": False}
    ),
    "vllm": Kind(
        "vllm",
        r"vllm-0\.32\.0",
        {**LLM, "functionCalling": False},
        env={
            "FAKE_VLLM_PYTHON": sys.executable,
            "FAKE_VLLM_CHUNK_DELAY_MS": "100",
            "RUNNER_MEMORY_MB": "81920",
            "VLLM_GPU_MEMORY_UTILIZATION": "0.3",
        },
    ),
    "comfyui": Kind(
        "comfyui",
        r"comfyui-0\.3\.64",
        dict.fromkeys(("streaming", "prefixCaching", "visionInput", "audioInput"), False)
        | {"functionCalling": False},
        fake_args=("--slow-step-ms", "150"),
        env={"COMFYUI_CPU": "true"},
    ),
}


@dataclass
class Runner:
    kind: Kind
    proc: RunnerProcess

    @property
    def url(self) -> str:
        return self.proc.url

    def send(self, model: str, tenant: str = "acme", *, slow: bool = False) -> httpx.Response:
        path, body = self.kind.request(model, slow=slow)
        headers = {"X-Tenant-ID": tenant}
        return httpx.post(self.url + path, json=body, headers=headers, timeout=60)


@pytest.fixture(scope="module", params=list(KINDS))
def runner(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Runner]:
    kind = KINDS[request.param]
    root = tmp_path_factory.mktemp(kind.backend)
    with start_runner(
        models_file=kind.models_file(root), env=kind.settings(root), ready_timeout=60
    ) as proc:
        yield Runner(kind, proc)


def test_contract_capabilities_shape(runner: Runner) -> None:
    """The seed's keys at every level (plus the documented additions `identity`,
    `governance` (the audit log's public key and head), `models.failed`,
    `resources.memorySource` and `queue.running`), the engine and its version in
    `runnerType`, and the loaded engine's flags."""

    def versioned() -> dict[str, Any] | None:  # the version is learnt by a stats poll
        doc = caps(runner.url)
        return doc if "-" in doc["runnerType"] else None

    doc = eventually(versioned, timeout=30, what="the engine's version in runnerType")
    assert set(doc) == SEED_TOP | {"identity", "governance"} and doc["identity"] == "open"
    assert set(doc["governance"]["audit"]) == {"algorithm", "keyId", "publicKey", "head"}
    assert re.fullmatch(runner.kind.runner_type, doc["runnerType"]), doc["runnerType"]
    assert doc["runnerId"] == "test-runner" and doc["health"] == "healthy"
    assert set(doc["models"]) == {"loaded", "loading", "available", "failed"}
    assert [set(m) for m in doc["models"]["loaded"]] == [SEED_LOADED]
    assert all(set(m) == SEED_LOADING for m in doc["models"]["loading"])
    assert doc["models"]["available"] == ["m", "n"]
    assert set(doc["resources"]) == SEED_RESOURCES | {"memorySource"}
    assert set(doc["queue"]) == SEED_QUEUE | {"running", "forecastWaitMs", "forecastWaitMsByModel"}
    assert doc["queue"]["maxDepth"] == 1
    assert set(doc["capabilities"]) == SEED_FLAGS
    assert doc["capabilities"] == {**runner.kind.features, "multiTenant": True}


def test_contract_governed_load_and_unload(runner: Runner) -> None:
    """A load without a token is 401; with one it completes, the model serves, then a
    governed unload answers the seed's fields and the model answers 404 again."""
    url = runner.url
    assert httpx.post(url + "/v1/models/load", json={"modelId": "n"}).status_code == 401
    assert runner.send("n").json()["error"]["code"] == "model_not_loaded"
    done = load_and_wait(url, "n")
    assert done["status"] == "completed", done.get("error")
    assert done["modelId"] == "n" and done["gpuMemoryUsedMB"] >= 0 and done["loadTimeMs"] > 0
    assert sorted(loaded(url)) == ["m", "n"]
    runner.kind.check_answer(runner.send("n"))
    assert httpx.post(url + "/v1/models/unload", json={"modelId": "n"}).status_code == 401
    r = unload(url, "n")
    assert r.status_code == 200, r.text
    answer = r.json()
    assert set(answer) == {"modelId", "gpuMemoryFreedMB", "kvCacheFlushed"}
    assert answer["modelId"] == "n" and answer["gpuMemoryFreedMB"] >= 0
    assert loaded(url) == ["m"]
    assert runner.send("n").status_code == 404


def test_contract_tenant_rate_limit(runner: Runner) -> None:
    """TENANT_RATE_LIMIT_limited=2req/min: two answers, then 429 with Retry-After; other
    tenants are not affected."""
    for _ in range(2):
        runner.kind.check_answer(runner.send("m", "limited"))
    refused = runner.send("m", "limited")
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) > 0
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    runner.kind.check_answer(runner.send("m", "other"))


def test_contract_queue_full(runner: Runner) -> None:
    """One slot busy and MAX_QUEUE_DEPTH=1 taken: the next request is 503 queue_full with
    Retry-After; the two admitted ones are answered."""
    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(runner.send, "m", "t1", slow=True)
        eventually(lambda: caps(runner.url)["queue"]["running"] >= 1 or _in_flight(runner), 20)
        queued = pool.submit(runner.send, "m", "t2")
        eventually(lambda: caps(runner.url)["queue"]["depth"] >= 1, 20, "a queued request")
        refused = runner.send("m", "t3")
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "queue_full"
        assert "retry-after" in refused.headers
        runner.kind.check_answer(held.result(60))
        runner.kind.check_answer(queued.result(60))


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample of a Prometheus text answer (None when absent)."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def _in_flight(runner: Runner) -> bool:
    text = httpx.get(runner.url + "/metrics").text
    return 'quorum_requests_in_flight{model="m"} 1.0' in text


def test_contract_metrics(runner: Runner) -> None:
    """/metrics has the runner's own series for the model's requests and no `vllm:*` name;
    /metrics/picker the endpoint picker's `vllm:*` gauges as the runner's own (one sample
    each, whatever the engine), and for vLLM its other `vllm:*` families re-exposed with
    the model's name."""
    runner.kind.check_answer(runner.send("m", "metered"))
    own = httpx.get(runner.url + "/metrics").text
    assert sample(own, "quorum_requests_total", model="m", tenant="metered", status="200") == 1
    assert 'quorum_inference_duration_seconds_count{model="m"}' in own
    assert "quorum_queue_depth" in own
    assert "vllm:" not in own
    text = httpx.get(runner.url + "/metrics/picker").text
    assert sample(text, "vllm:num_requests_running") is not None
    assert 'vllm:num_requests_running{engine="0",model_name="m"}' not in text
    engine_own = [
        line for line in text.splitlines() if line.startswith("vllm:") and "model_name=" in line
    ]
    if runner.kind.backend == "vllm":  # from the engine's last scrape, taken off the hot
        # path: the first may follow start-up
        family = 'vllm:prefix_cache_queries_total{engine="0",model_name="m"}'
        picker = runner.url + "/metrics/picker"
        eventually(lambda: family in httpx.get(picker).text, 20, "vLLM's families re-exposed")
    else:
        assert engine_own == []
