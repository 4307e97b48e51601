"""Issue 17's metrics: engine crashes and restarts, jobs and images, engines' own queues,
no `_none` labels, KV figures only for engines with a KV cache (runner/telemetry/outcome_metrics.py,
runner/telemetry/state_metrics.py, runner/telemetry/snapshot.py)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from adapters.launched import EngineLoad
from adapters.reaper import GUARD_SCRIPT
from runner.engines.kinds import EngineKinds
from runner.engines.pool import ModelPool
from runner.memory.proc import child_pids
from runner.memory.telemetry import TelemetrySnapshot
from runner.telemetry.snapshot import Refresher, SnapshotCollector
from runner.telemetry.state_metrics import EngineQueueCollector
from tests.fixtures.launch import start_fake
from tests.support.engines import CHECKPOINT, comfyui_root
from tests.support.runner_proc import RunnerProcess, fixture_bin, start_runner, wait_started

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


JSON_TYPE = {"Content-Type": "application/json"}


def _samples(url: str, name: str) -> dict[str, float]:
    """Every sample of `name` on /metrics, keyed by its label text."""
    text = httpx.get(url + "/metrics", timeout=10).text
    found = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            found[labels[len(name) :]] = float(value)
    return found


def _eventually(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.05)


def _engine_pid(runner: RunnerProcess) -> int:
    """The runner's one engine process (its child that is not the process-group guard,
    adapters/reaper.py)."""
    children = [
        pid
        for pid in child_pids(runner.proc.pid) or []
        if GUARD_SCRIPT.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    assert len(children) == 1, children
    return children[0]


@pytest.mark.timeout(60)
def test_metrics_engine_crash_and_restart_counted_by_model_and_backend() -> None:
    """SIGKILL of an engine with `restart: true`: one crash, then one restart, labelled with
    the model and its engine kind."""
    models = "\n".join(
        [
            "models:",
            "  - id: m",
            "    backend: llama-server",
            "    path: /dev/null",
            "    preload: true",
            "    restart: true",
            "    vram_mb: 64",
            f"    bin: {fixture_bin('llama-server-ok')}",
        ]
    )
    with start_runner(models_file=models + "\n") as runner:
        labels = '{backend="llama-server",model="m"}'
        assert _samples(runner.url, "quorum_engine_crashes_total") == {}
        os.kill(_engine_pid(runner), signal.SIGKILL)
        _eventually(
            lambda: _samples(runner.url, "quorum_engine_restarts_total").get(labels) == 1.0,
            30,
            "the restart counted",
        )
        assert _samples(runner.url, "quorum_engine_crashes_total") == {labels: 1.0}
        _eventually(
            lambda: httpx.post(runner.url + "/v1/chat/completions", json=CHAT).status_code == 200,
            30,
            "served again",
        )


@pytest.mark.timeout(60)
def test_metrics_requests_refused_before_their_model_carry_no_made_up_label() -> None:
    """A request refused before its model is read (bad header, body not JSON) is counted
    with an empty model label, never `_none`; an unknown model reads `_unknown`."""
    with start_runner({}) as runner:
        url = runner.url + "/v1/chat/completions"
        assert httpx.post(url, json=CHAT, headers={"X-Priority": "urgent"}).status_code == 400
        assert httpx.post(url, content=b"{nope", headers=JSON_TYPE).status_code == 400
        assert httpx.post(url, json={**CHAT, "model": "nope"}).status_code == 404
        requests = _samples(runner.url, "quorum_requests_total")
    assert '{model="",status="400",tenant="_invalid"}' in requests
    assert '{model="",status="400",tenant="default"}' in requests
    assert '{model="_unknown",status="404",tenant="default"}' in requests
    assert not any("_none" in labels for labels in requests)


@pytest.mark.timeout(120)
def test_metrics_images_jobs_and_engine_queue_on_comfyui(tmp_path: Path) -> None:
    """Images answered (sync and as a job) are counted by model and tenant, the job by kind
    and outcome, and the fake ComfyUI's own queue is exported per model."""
    folder = comfyui_root(tmp_path / "ComfyUI")
    with start_fake("fake_comfyui", "--base-directory", str(folder)) as comfy:
        models = (
            "models:\n"
            f"  - {{id: sd, backend: comfyui, url: '{comfy.url}', checkpoint: {CHECKPOINT}}}\n"
        )
        # `acme` is declared (an env limit): tenant labels are the declared tenants' only
        env = {
            "COMFYUI_PATH": str(folder),
            "ENGINE_STATS_INTERVAL_S": "0.2",
            "TENANT_RATE_LIMIT_acme": "unlimited",
        }
        with start_runner(models_file=models, env=env, wait_ready=False) as runner:
            wait_started(runner, 60)
            post = runner.url + "/v1/images/generations"
            body = {"model": "sd", "prompt": "a red fox", "size": "64x64", "n": 2}
            sync = httpx.post(post, json=body, headers={"X-Tenant-ID": "acme"}, timeout=60)
            assert sync.status_code == 200, sync.text
            job = httpx.post(
                post,
                json={**body, "n": 1},
                headers={"X-Tenant-ID": "acme", "Prefer": "respond-async"},
                timeout=60,
            )
            assert job.status_code == 202, job.text
            location = runner.url + job.headers["Location"]

            def done() -> bool:
                doc = httpx.get(location, headers={"X-Tenant-ID": "acme"}).json()
                return bool(doc["status"] == "succeeded")

            _eventually(done, 60, "the image job succeeded")
            images = _samples(runner.url, "quorum_images_total")
            jobs = _samples(runner.url, "quorum_jobs_total")
            _eventually(
                lambda: '{model="sd"}' in _samples(runner.url, "quorum_engine_queue_depth"),
                10,
                "the engine's queue exported",
            )
    assert images == {'{model="sd",tenant="acme"}': 3.0}
    assert jobs == {'{kind="image_generation",outcome="succeeded"}': 1.0}


def test_engine_queue_collector_exports_waiting_and_running_per_model() -> None:
    """The engines' own figures, as last polled, one series per model that reports them."""
    loads = {"v": EngineLoad(waiting=3, running=2), "c": EngineLoad(waiting=1)}
    registry = CollectorRegistry()
    registry.register(EngineQueueCollector(lambda: loads))
    text = generate_latest(registry).decode()
    assert 'quorum_engine_queue_depth{model="v"} 3.0' in text
    assert 'quorum_engine_requests_running{model="v"} 2.0' in text
    assert 'quorum_engine_queue_depth{model="c"} 1.0' in text
    loads.clear()
    assert "model=" not in generate_latest(registry).decode()


class _Telemetry:
    def snapshot(self) -> TelemetrySnapshot:
        return TelemetrySnapshot("budget", ())

    def process_used_mb(self, pids: Iterable[int]) -> int:
        return 900

    def close(self) -> None:
        return None


def _record(backend: str) -> Any:
    spec = SimpleNamespace(
        id=backend, backend=backend, attached=False, local_path=lambda: None, vram_mb=None
    )
    launched = SimpleNamespace(kv=None, process=SimpleNamespace(pid=os.getpid()))  # no KV figures
    return SimpleNamespace(spec=spec, launched=launched, process=launched.process, mem_mb=0)


async def test_snapshot_kv_figures_only_for_engines_with_a_kv_cache() -> None:
    """ComfyUI's and faster-whisper's memory beyond their weights is `other`, KV 0 (as
    capabilities say); llama-server's and vLLM's is `kv_cache`."""
    records = {b: _record(b) for b in ("comfyui", "faster-whisper", "vllm", "llama-server")}

    async def hold_leases() -> None:
        return None

    pool = SimpleNamespace(
        records=records, serving=lambda: list(records), hold_leases=hold_leases, kinds=EngineKinds()
    )
    snap = await Refresher(cast(ModelPool, pool), _Telemetry()).refresh()
    by_model = {m.model: m for m in snap.models}
    assert by_model["comfyui"].kv_mb == 0 and by_model["comfyui"].other_mb == 900
    assert by_model["faster-whisper"].kv_mb == 0
    assert by_model["vllm"].kv_mb == 900 and by_model["llama-server"].kv_mb == 900
    assert snap.kv_mb == 1800
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: snap))
    text = generate_latest(registry).decode()
    assert 'quorum_model_memory_bytes{kind="kv_cache",model="vllm"}' in text
    assert 'quorum_model_memory_bytes{kind="kv_cache",model="comfyui"}' not in text
    assert 'quorum_model_memory_bytes{kind="other",model="comfyui"}' in text
